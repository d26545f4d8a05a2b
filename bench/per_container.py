"""What one container costs on the kubelet's side of the socket, against a do-nothing reference.

For every container needing a device, a kubelet calls GetPreferredAllocation (only if the
plugin advertised ``get_preferred_allocation_available``) and then Allocate, over the one
client connection it keeps per registered plugin (``pkg/kubelet/cm/devicemanager``
endpoint). This replays that sequence 1000 times, in the same run, against the real
``serve`` process registered with an emulated 1.26 kubelet (units: no topology, so one call;
Intel ports on two NUMA nodes: preferred allocation packs them, so two calls) and against
:mod:`bench.reference_plugin`, and prints each with its ratio to the reference.
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
from bench import reference_plugin
from bench.serving import serve_command
from bench.serving import stop as _stop
from bench.table import Row, median, ms, percentile
from compat_tests.kubelet import KubeletEmulator
from plugin.backends.fake_sysfs import FakeNode

RESOURCE = "b-com.com/accelerator"
UNITS = 40
PORTS = 8
CONTAINERS = 1000
WARM_UP = 100


async def _containers(socket_path: Path, ids: list[str]) -> list[float]:
    """Seconds per container: GetPreferredAllocation if advertised, then Allocate."""
    wire = WireApi.load("v1beta1")
    methods = wire.methods("DevicePlugin")
    async with grpc.aio.insecure_channel(f"unix://{socket_path}") as channel:
        options = await client_call(channel, methods["GetDevicePluginOptions"])(
            wire.new("Empty"), timeout=10)
        preferred = client_call(channel, methods["GetPreferredAllocation"])
        allocate = client_call(channel, methods["Allocate"])
        figures = []
        for n in range(WARM_UP + CONTAINERS):
            began = time.perf_counter()
            chosen: list[str] = [ids[n % len(ids)]]
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


async def _registered(directory: Path, command: list[str], resource: str) -> list[float]:
    """Start a plugin process, let an emulated 1.26 kubelet hold it, then replay containers."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        async with KubeletEmulator(directory, "1.26") as kubelet:
            devices = await kubelet.wait_for_devices(resource, timeout=30)
            socket_path = kubelet.endpoint_socket(resource)
            assert socket_path is not None
            return await _containers(socket_path, sorted(devices))
    finally:
        _stop(process)


def _ours(directory: Path, *flags: str) -> list[float]:
    return asyncio.run(_registered(directory, serve_command(directory, *flags), RESOURCE))


def _reference(directory: Path) -> list[float]:
    command = [sys.executable, "-m", "bench.reference_plugin", str(directory), str(UNITS)]
    return asyncio.run(_registered(directory, command, reference_plugin.RESOURCE))


def _numa_node(root: Path) -> FakeNode:
    node = FakeNode(root)
    for index in range(PORTS):
        node.add_dfl_card(f"0000:{0x3b + index:02x}:00.0", numa_node=index % 2)
    return node


def run() -> list[Row]:
    directory = Path(tempfile.mkdtemp(prefix="dpc", dir="/tmp"))
    try:
        node = _numa_node(directory / "node")
        units = _ours(directory, "--backend", "units", "--accel-nbunits", str(UNITS))
        ports = _ours(directory, "--backend", "intel", "--sysfs-root", str(node.sysfs_root),
                      "--dev-root", str(node.dev_root))
        reference = _reference(directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    floor = median(reference)

    def pair(figures: list[float]) -> str:
        return f"{ms(median(figures))} / {ms(percentile(figures, 99))}"

    return [
        Row("per container, do-nothing reference plugin, p50 / p99", pair(reference), "",
            f"{CONTAINERS} containers: Allocate over one kept connection, as a kubelet calls; "
            "bench/reference_plugin.py (same grpc.aio stack, canned answers), registered "
            "with the same emulated kubelet"),
        Row("per container, units (no topology: Allocate only), p50 / p99", pair(units), "",
            "preferred allocation not advertised: it could not change the kubelet's pick"),
        Row("per container, units, ours / reference (p50)", f"{median(units) / floor:.2f}x",
            "<= 1.2x", "what the plugin adds over Python gRPC's own floor"),
        Row(f"per container, {PORTS} ports on 2 NUMA nodes, p50 / p99", pair(ports), "",
            "GetPreferredAllocation (NUMA packing) + Allocate: two calls"),
        Row("per container, NUMA ports, ours / reference (p50)",
            f"{median(ports) / floor:.2f}x", "", "the second call is the price of packing"),
    ]


if __name__ == "__main__":
    from bench.table import render

    print(render(run()))
