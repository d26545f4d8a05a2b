"""A health fault of every backend, as the kubelet hears it (the Intel ports in more detail:
bench/hotplug.py).

For each fault of ``compat_tests/test_backend_faults.py`` (an AFU crash, an Alveo firewall
trip, an F1 slot unloaded...), the real ``serve`` process runs ``--backend auto`` on a fake
node holding that one card and an emulated 1.26 kubelet holds its ListAndWatch stream. Each
figure is the time from breaking (or mending) the tree to the kubelet holding the device
Unhealthy (or Healthy again). The test only asserts that the kubelet hears it; how soon is
here, where a busy machine makes a slow figure rather than a failed test.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path

from bench.serving import spawn_serve
from bench.serving import stop as _stop
from bench.table import Row, median, ms
from compat_tests.kubelet import KubeletEmulator
from compat_tests.test_backend_faults import FAULTS

RESOURCE = "b-com.com/accelerator"
ROUNDS = 3
PATIENCE = 30.0


async def _fault(root: Path, fault: str) -> list[float]:
    """Break and mend ``fault`` ROUNDS times; the seconds each change took to be heard."""
    build, break_it, mend_it = FAULTS[fault]
    node, port, device = build(root / "node")
    directory = root / "dp"
    directory.mkdir()
    process = spawn_serve(directory, "--backend", "auto", "--sysfs-root", str(node.sysfs_root),
                          "--dev-root", str(node.dev_root))
    figures = []
    try:
        async with KubeletEmulator(directory, "1.26") as kubelet:
            await kubelet.wait_for_devices(RESOURCE, lambda d: device in d and d[device].healthy,
                                           timeout=PATIENCE)
            for _ in range(ROUNDS):
                for action, healthy in ((break_it, False), (mend_it, True)):
                    began = time.perf_counter()
                    action(node, port, device)
                    await kubelet.wait_for_devices(
                        RESOURCE, lambda d, h=healthy: device in d and d[device].healthy is h,
                        timeout=PATIENCE)
                    figures.append(time.perf_counter() - began)
    finally:
        _stop(process)
    return figures


def run() -> list[Row]:
    figures: dict[str, list[float]] = {}
    for fault in FAULTS:
        root = Path(tempfile.mkdtemp(prefix="dpbh", dir="/tmp"))
        try:
            figures[fault] = asyncio.run(_fault(root, fault))
        finally:
            shutil.rmtree(root, ignore_errors=True)
    every = [f for values in figures.values() for f in values]
    slowest = max(figures, key=lambda fault: median(figures[fault]))
    return [
        Row("health change -> kubelet, every backend's faults", ms(median(every)), "< 1 s",
            f"median of {len(every)} ({len(figures)} faults, broken and mended {ROUNDS} times, "
            f"--backend auto), max {ms(max(every))}; slowest fault {slowest} "
            f"(median {ms(median(figures[slowest]))})"),
    ]


if __name__ == "__main__":
    from bench.table import render

    print(render(run()))
