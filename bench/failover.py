"""What a kubelet sees when things go wrong, measured on the real ``serve`` process.

* handover: two instances on one socket (a rolling update with ``maxSurge: 1``); time from
  the signal to the old process to the kubelet holding the new one's devices again, after a
  clean stop (SIGTERM) and after SIGKILL (socket left behind);
* crashed kubelet: a kubelet killed with ``kubelet.sock`` left behind, replaced 2 s later by
  one that does not wipe the directory; time from the new kubelet's start to devices held.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from bench.serving import spawn_units
from bench.serving import stop as _stop
from bench.table import Row, median, ms
from compat_tests.kubelet import KubeletEmulator

RESOURCE = "b-com.com/accelerator"
UNITS = 8
HANDOVERS = 5
CRASHES = 5
CRASH_DOWNTIME = 2.0



async def _wait_for_waiting(process: subprocess.Popen[bytes]) -> None:
    """Give the newcomer time to start, probe the socket and settle into waiting."""
    await asyncio.sleep(1.5)
    if process.poll() is not None:
        raise RuntimeError("the second instance exited")


async def _handovers(directory: Path, kill: bool) -> list[float]:
    figures = []
    async with KubeletEmulator(directory, "1.26") as kubelet:
        old = spawn_units(directory, UNITS)
        await kubelet.wait_for_devices(RESOURCE, timeout=30)
        for _ in range(HANDOVERS):
            new = spawn_units(directory, UNITS)
            await _wait_for_waiting(new)
            registered = len(kubelet.registrations)
            gone = time.perf_counter()
            # Never block this loop waiting for the old process: the emulated kubelet runs
            # on it, and the old instance waits for the kubelet to drop its connection.
            old.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            await kubelet.wait_until(lambda n=registered: len(kubelet.registrations) > n,
                                     timeout=30, what="the newcomer's registration")
            await kubelet.wait_for_devices(RESOURCE, timeout=30)
            figures.append(time.perf_counter() - gone)
            await asyncio.to_thread(old.wait, 10)
            old = new
        _stop(old)
    return figures


async def _crashed_kubelets(directory: Path) -> list[float]:
    figures = []
    process = spawn_units(directory, UNITS)
    try:
        kubelet = KubeletEmulator(directory, "1.26")
        await kubelet.start()
        await kubelet.wait_for_devices(RESOURCE, timeout=30)
        for _ in range(CRASHES):
            await kubelet.crash()
            await asyncio.sleep(CRASH_DOWNTIME)
            kubelet = KubeletEmulator(directory, "1.26", wipe_at_start=False)
            began = time.perf_counter()
            await kubelet.start()
            await kubelet.wait_for_devices(RESOURCE, timeout=30)
            figures.append(time.perf_counter() - began)
        await kubelet.stop()
    finally:
        _stop(process)
    return figures


def run() -> list[Row]:
    directory = Path(tempfile.mkdtemp(prefix="dpf", dir="/tmp"))
    try:
        clean = asyncio.run(_handovers(directory, kill=False))
        killed = asyncio.run(_handovers(directory, kill=True))
        crashed = asyncio.run(_crashed_kubelets(directory))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return [
        Row("handover to a waiting instance, old one stopped", ms(median(clean)), "< 1 s",
            f"median of {HANDOVERS}: SIGTERM to the old one to devices held again"),
        Row("handover to a waiting instance, old one killed", ms(median(killed)), "< 1 s",
            f"median of {HANDOVERS}: SIGKILL (socket left behind) to devices held again"),
        Row("crashed kubelet replaced, directory not wiped", ms(median(crashed)), "< 1 s",
            f"median of {CRASHES}: new kubelet start to devices held, "
            f"{CRASH_DOWNTIME:.0f} s after the crash"),
    ]


if __name__ == "__main__":
    from bench.table import render

    print(render(run()))
