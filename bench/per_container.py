"""What one container costs on the kubelet's side of the socket, against a do-nothing reference.

For every container needing a device, a kubelet that was told
``get_preferred_allocation_available`` calls GetPreferredAllocation and then Allocate, over
the one client connection it keeps per registered plugin (``pkg/kubelet/cm/devicemanager``
endpoint). This replays that pair 1000 times against the real ``serve`` process (units
backend, 40 units, registered with an emulated 1.26 kubelet so it serves as on a node) and
against :mod:`bench.reference_plugin` in the same run, and prints both and their ratio.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from api_versions.wire import WireApi, client_call
from bench.serving import spawn_serve
from bench.serving import stop as _stop
from bench.table import Row, median, ms, percentile
from compat_tests.kubelet import KubeletEmulator

RESOURCE = "b-com.com/accelerator"
UNITS = 40
CONTAINERS = 1000
WARM_UP = 100


async def _containers(socket_path: Path) -> list[float]:
    """Seconds per container: (GetPreferredAllocation if advertised) + Allocate."""
    wire = WireApi.load("v1beta1")
    methods = wire.methods("DevicePlugin")
    ids = [str(i) for i in range(UNITS)]
    async with grpc.aio.insecure_channel(f"unix://{socket_path}") as channel:
        options = await client_call(channel, methods["GetDevicePluginOptions"])(
            wire.new("Empty"), timeout=10)
        preferred = client_call(channel, methods["GetPreferredAllocation"])
        allocate = client_call(channel, methods["Allocate"])
        figures = []
        for n in range(WARM_UP + CONTAINERS):
            began = time.perf_counter()
            chosen: list[str] = [ids[n % UNITS]]
            if options.get_preferred_allocation_available:
                request = wire.new("PreferredAllocationRequest", container_requests=[
                    wire.new("ContainerPreferredAllocationRequest", available_deviceIDs=ids,
                             must_include_deviceIDs=[], allocation_size=1)])
                answer: Any = await preferred(request, timeout=10)
                chosen = list(answer.container_responses[0].deviceIDs)
            await allocate(wire.new("AllocateRequest", container_requests=[
                wire.new("ContainerAllocateRequest", devices_ids=chosen)]), timeout=10)
            if n >= WARM_UP:
                figures.append(time.perf_counter() - began)
        return figures


async def _ours(directory: Path) -> list[float]:
    process = spawn_serve(directory, "--backend", "units", "--accel-nbunits", str(UNITS))
    try:
        async with KubeletEmulator(directory, "1.26") as kubelet:
            await kubelet.wait_for_devices(RESOURCE, timeout=30)
            socket_path = kubelet.endpoint_socket(RESOURCE)
            assert socket_path is not None
            return await _containers(socket_path)
    finally:
        _stop(process)


async def _reference(directory: Path) -> list[float]:
    socket_path = directory / "reference.sock"
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.reference_plugin", str(socket_path), str(UNITS)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            if socket_path.exists():
                break
            await asyncio.sleep(0.02)
        return await _containers(socket_path)
    finally:
        _stop(process)


def run() -> list[Row]:
    directory = Path(tempfile.mkdtemp(prefix="dpc", dir="/tmp"))
    try:
        ours = asyncio.run(_ours(directory))
        reference = asyncio.run(_reference(directory))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    ratio = median(ours) / median(reference)
    return [
        Row("per container: preferred + Allocate, p50", ms(median(ours)), "",
            f"{CONTAINERS} containers, one kept connection, as the kubelet calls"),
        Row("per container: preferred + Allocate, p99", ms(percentile(ours, 99)), "", ""),
        Row("same sequence, do-nothing reference plugin, p50 / p99",
            f"{ms(median(reference))} / {ms(percentile(reference, 99))}", "",
            "bench/reference_plugin.py: same grpc.aio stack, canned answers"),
        Row("per container, ours / reference (p50)", f"{ratio:.2f}x", "<= 1.2x",
            "the cost the plugin adds over Python gRPC's own floor"),
    ]


if __name__ == "__main__":
    from bench.table import render

    print(render(run()))
