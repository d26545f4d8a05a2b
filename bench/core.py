"""Serving benchmarks against the real ``serve`` process and an emulated 1.26 kubelet.

Measured from the kubelet's side of the socket, as a node would feel it: time from process
start to a registration, Allocate round trips, re-registration after a kubelet restart, and
the resident memory of the serving process after all of that.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path

from bench.serving import spawn_units
from bench.serving import stop as _stop
from bench.table import Row, median, ms, percentile
from compat_tests.kubelet import KubeletEmulator

RESOURCE = "b-com.com/accelerator"
UNITS = 40
STARTS = 5
RESTARTS = 10
ALLOCATIONS = 1000



def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


async def _start_to_registered(directory: Path) -> float:
    async with KubeletEmulator(directory, "1.26") as kubelet:
        began = time.perf_counter()
        process = spawn_units(directory, UNITS)
        try:
            await kubelet.wait_for_registrations(1, timeout=30)
            return time.perf_counter() - began
        finally:
            _stop(process)


async def _serving_figures(directory: Path) -> tuple[list[float], list[float], float]:
    process = spawn_units(directory, UNITS)
    try:
        kubelet = KubeletEmulator(directory, "1.26")
        await kubelet.start()
        await kubelet.wait_for_devices(RESOURCE, timeout=30)
        latencies = []
        for i in range(ALLOCATIONS):
            began = time.perf_counter()
            await kubelet.allocate(RESOURCE, [str(i % 40)])
            latencies.append(time.perf_counter() - began)
        restarts = []
        for _ in range(RESTARTS):
            await kubelet.stop()
            kubelet = KubeletEmulator(directory, "1.26")
            began = time.perf_counter()
            await kubelet.start()
            await kubelet.wait_for_registrations(1, timeout=30)
            restarts.append(time.perf_counter() - began)
        await kubelet.wait_for_devices(RESOURCE, timeout=30)
        rss = _rss_mib(process.pid)
        await kubelet.stop()
        return latencies, restarts, rss
    finally:
        _stop(process)


def run() -> list[Row]:
    directory = Path(tempfile.mkdtemp(prefix="dpb", dir="/tmp"))
    try:
        starts = [asyncio.run(_start_to_registered(directory)) for _ in range(STARTS)]
        latencies, restarts, rss = asyncio.run(_serving_figures(directory))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return [
        Row("start to registered (v1beta1, 1.26 kubelet)", ms(median(starts)), "< 300 ms",
            f"median of {STARTS} process starts; includes interpreter start and imports"),
        Row("Allocate p50", ms(percentile(latencies, 50)), "< 1 ms",
            f"{ALLOCATIONS} calls, kubelet-side round trip over the unix socket"),
        Row("Allocate p99", ms(percentile(latencies, 99)), "", ""),
        Row("re-registration after kubelet restart", ms(median(restarts)), "< 100 ms",
            f"median of {RESTARTS}: new kubelet start to Register received"),
        Row("resident memory of serve", f"{rss:.1f} MiB", "< 40 MB",
            "VmRSS after the runs above"),
    ]


if __name__ == "__main__":
    from bench.table import render

    print(render(run()))
