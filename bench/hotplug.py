"""Hot-plug as the kubelet feels it (idle cost: bench/idle.py).

The real ``serve`` process runs the Intel backend on a fake node (six ports) and an emulated
1.26 kubelet holds its ListAndWatch stream. Each figure is the time from changing the tree
to the kubelet holding the new list. Port arrival and departure, and a deleted device node,
show up in the device-node directory, so they are event-driven; a crashed AFU gives no event
and is found by the re-read of the health files (``--health-interval``), measured on its own.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.serving import spawn_serve
from bench.serving import stop as _stop
from bench.table import Row, median, ms
from compat_tests.fake_sysfs import (
    CRASHED_AFU_ID,
    DEFAULT_AFU_ID,
    FakeNode,
    build_intel_node,
)
from compat_tests.kubelet import KubeletEmulator

RESOURCE = "b-com.com/accelerator"
WATCHED = "0000:5e:00.0"
ROUNDS = 10
AFU_ROUNDS = 10
RESCAN_INTERVAL = 5.0
PATIENCE = 30.0

Devices = dict


def _spawn(directory: Path, node: FakeNode) -> subprocess.Popen[bytes]:
    return spawn_serve(
        directory, "--backend", "intel", "--sysfs-root", str(node.sysfs_root),
        "--dev-root", str(node.dev_root), "--rescan-interval", str(RESCAN_INTERVAL),
    )


async def _timed(kubelet: KubeletEmulator, change: Callable[[], object],
                 seen: Callable[[Devices], bool]) -> float:
    began = time.perf_counter()
    change()
    await kubelet.wait_for_devices(RESOURCE, seen, timeout=PATIENCE)
    return time.perf_counter() - began


def _absent(devices: Devices) -> bool:
    return WATCHED not in devices


def _healthy(devices: Devices) -> bool:
    return WATCHED in devices and devices[WATCHED].healthy


def _unhealthy(devices: Devices) -> bool:
    return WATCHED in devices and not devices[WATCHED].healthy


async def _measure(directory: Path, node: FakeNode) -> dict[str, list[float]]:
    figures: dict[str, list[float]] = {k: [] for k in ("gone", "back", "node", "afu")}
    process = _spawn(directory, node)
    try:
        async with KubeletEmulator(directory, "1.26") as kubelet:
            await kubelet.wait_for_devices(RESOURCE, lambda d: len(d) == 6, timeout=PATIENCE)
            port = "intel-fpga-port.0"
            for _ in range(ROUNDS):
                figures["gone"].append(
                    await _timed(kubelet, lambda p=port: node.remove_port(p), _absent))
                names: list[str] = []
                figures["back"].append(await _timed(
                    kubelet, lambda n=names: n.append(node.add_port(WATCHED)), _healthy))
                port = names[0]
            for _ in range(ROUNDS):
                figures["node"].append(await _timed(
                    kubelet, lambda p=port: node.delete_device_node(p), _unhealthy))
                await _timed(kubelet, lambda p=port: node.restore_device_node(p), _healthy)
            for _ in range(AFU_ROUNDS):
                figures["afu"].append(await _timed(
                    kubelet, lambda p=port: node.set_afu_id(p, CRASHED_AFU_ID), _unhealthy))
                await _timed(kubelet, lambda p=port: node.set_afu_id(p, DEFAULT_AFU_ID), _healthy)
    finally:
        _stop(process)
    return figures


def run() -> list[Row]:
    root = Path(tempfile.mkdtemp(prefix="dphp", dir="/tmp"))
    try:
        node = build_intel_node(root / "node")
        directory = root / "dp"
        directory.mkdir()
        figures = asyncio.run(_measure(directory, node))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return [
        Row("hot-plug: port removed -> ListAndWatch", ms(median(figures["gone"])), "< 1 s",
            f"median of {ROUNDS}, max {ms(max(figures['gone']))}; event-driven"),
        Row("hot-plug: port added -> ListAndWatch", ms(median(figures["back"])), "< 1 s",
            f"median of {ROUNDS}, max {ms(max(figures['back']))}; event-driven"),
        Row("device node deleted -> Unhealthy", ms(median(figures["node"])), "< 1 s",
            f"median of {ROUNDS}, max {ms(max(figures['node']))}; event-driven"),
        Row("AFU crashed -> Unhealthy", ms(median(figures["afu"])), "< 1 s",
            f"median of {AFU_ROUNDS}, max {ms(max(figures['afu']))}; no event: found by the "
            "health-file re-read (--health-interval 0.5 s)"),
    ]


if __name__ == "__main__":
    from bench.table import render

    print(render(run()))
    os._exit(0)
