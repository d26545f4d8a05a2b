"""What one container costs on the kubelet's side of the socket, against do-nothing references.

For every container needing a device, a kubelet calls GetPreferredAllocation (only if the
plugin advertised ``get_preferred_allocation_available``) and then Allocate, over the one
client connection it keeps per registered plugin (``pkg/kubelet/cm/devicemanager``
endpoint). This replays that sequence for 1000 containers against four plugins at once, each
registered with an emulated 1.26 kubelet of its own:

- the real ``serve`` with 40 units (no topology: preferred allocation not advertised, one call);
- the real ``serve`` with 8 Intel ports on two NUMA nodes (advertised: NUMA packing, two calls);
- :mod:`bench.reference_plugin` without preferred allocation (one call), and with it (two).

Containers are interleaved, one per plugin in turn with the order rotating, so every plugin
sees the same machine at the same moments; each ratio compares like with like from one run.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from api_versions.wire import WireApi, client_call
from bench import reference_plugin
from bench.serving import serve_command
from bench.serving import stop as _stop
from bench.table import Row, median, p50_p99
from compat_tests.fake_sysfs import FakeNode
from compat_tests.kubelet import KubeletEmulator

RESOURCE = "b-com.com/accelerator"
UNITS = 40
PORTS = 8
CONTAINERS = 1000
WARM_UP = 100

Container = Callable[[int], Awaitable[None]]


async def _kubelet_calls(stack: contextlib.AsyncExitStack, socket_path: Path,
                         ids: list[str]) -> Container:
    """One container's calls as the kubelet makes them, over one kept connection."""
    wire = WireApi.load("v1beta1")
    methods = wire.methods("DevicePlugin")
    channel = await stack.enter_async_context(
        grpc.aio.insecure_channel(f"unix://{socket_path}"))
    options = await client_call(channel, methods["GetDevicePluginOptions"])(
        wire.new("Empty"), timeout=10)
    preferred = client_call(channel, methods["GetPreferredAllocation"])
    allocate = client_call(channel, methods["Allocate"])

    async def container(n: int) -> None:
        chosen: list[str] = [ids[n % len(ids)]]
        if options.get_preferred_allocation_available:
            request = wire.new("PreferredAllocationRequest", container_requests=[
                wire.new("ContainerPreferredAllocationRequest", available_deviceIDs=ids,
                         must_include_deviceIDs=[], allocation_size=1)])
            answer: Any = await preferred(request, timeout=10)
            chosen = list(answer.container_responses[0].deviceIDs)
        await allocate(wire.new("AllocateRequest", container_requests=[
            wire.new("ContainerAllocateRequest", devices_ids=chosen)]), timeout=10)

    return container


async def _registered(stack: contextlib.AsyncExitStack, directory: Path, command: list[str],
                      resource: str) -> Container:
    """Start a plugin process, let an emulated 1.26 kubelet hold it, return its containers."""
    directory.mkdir(parents=True)
    kubelet = await stack.enter_async_context(KubeletEmulator(directory, "1.26"))
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stack.callback(_stop, process)
    devices = await kubelet.wait_for_devices(resource, timeout=30)
    socket_path = kubelet.endpoint_socket(resource)
    assert socket_path is not None
    return await _kubelet_calls(stack, socket_path, sorted(devices))


async def _interleaved(root: Path, node: FakeNode) -> dict[str, list[float]]:
    reference = [sys.executable, "-m", "bench.reference_plugin"]
    plugins = {
        # Logging at the default level: every Allocate is logged, as on a real node.
        "units": (serve_command(root / "units", "--log-level", "info", "--backend", "units",
                                "--accel-nbunits", str(UNITS)), RESOURCE),
        "ports": (serve_command(root / "ports", "--log-level", "info", "--backend", "intel",
                                "--sysfs-root", str(node.sysfs_root),
                                "--dev-root", str(node.dev_root)), RESOURCE),
        "reference": ([*reference, str(root / "reference"), str(UNITS)],
                      reference_plugin.RESOURCE),
        "reference-preferred": (
            [*reference, str(root / "reference-preferred"), str(UNITS), "preferred"],
            reference_plugin.RESOURCE),
    }
    async with contextlib.AsyncExitStack() as stack:
        containers = {name: await _registered(stack, root / name, command, resource)
                      for name, (command, resource) in plugins.items()}
        figures: dict[str, list[float]] = {name: [] for name in containers}
        names = list(containers)
        for n in range(WARM_UP + CONTAINERS):
            for name in names[n % len(names):] + names[:n % len(names)]:
                began = time.perf_counter()
                await containers[name](n)
                if n >= WARM_UP:
                    figures[name].append(time.perf_counter() - began)
        return figures


def _numa_node(root: Path) -> FakeNode:
    node = FakeNode(root)
    for index in range(PORTS):
        node.add_dfl_card(f"0000:{0x3b + index:02x}:00.0", numa_node=index % 2)
    return node


def run() -> list[Row]:
    root = Path(tempfile.mkdtemp(prefix="dpc", dir="/tmp"))
    try:
        figures = asyncio.run(_interleaved(root, _numa_node(root / "node")))
    finally:
        shutil.rmtree(root, ignore_errors=True)

    def pair(name: str) -> str:
        return p50_p99(figures[name])

    def ratio(name: str, floor: str) -> str:
        return f"{median(figures[name]) / median(figures[floor]):.2f}x"

    return [
        Row("per container, reference plugin, Allocate only, p50 / p99", pair("reference"), "",
            f"{CONTAINERS} containers, interleaved with the rows below; bench/reference_plugin"
            ".py: same grpc.aio stack, canned answers, registered with the same emulated kubelet"),
        Row("per container, units (no topology: Allocate only), p50 / p99", pair("units"), "",
            "preferred allocation not advertised: it could not change the kubelet's pick; "
            "default log level (each Allocate logged)"),
        Row("per container, units, ours / reference (p50)", ratio("units", "reference"),
            "<= 1.2x", "what the plugin adds over Python gRPC's own floor"),
        Row("per container, reference plugin, preferred + Allocate, p50 / p99",
            pair("reference-preferred"), "", "the reference advertising preferred allocation"),
        Row(f"per container, {PORTS} ports on 2 NUMA nodes, p50 / p99", pair("ports"), "",
            "GetPreferredAllocation (NUMA packing) + Allocate: two calls"),
        Row("per container, NUMA ports, ours / reference with preferred (p50)",
            ratio("ports", "reference-preferred"), "<= 1.2x", "two calls against two calls"),
        Row("per container, NUMA ports, ours / one-call reference (p50)",
            ratio("ports", "reference"), "", "the price of packing: a second call"),
    ]


if __name__ == "__main__":
    from bench.table import render

    print(render(run()))
