"""Re-registration after a kubelet restart, on each registration channel.

The real ``serve`` process and an emulated 1.32 kubelet whose plugin manager reconciles
every second, as a real one does. Each round stops the kubelet and starts a new one; the
figure is the time from the new kubelet starting to it holding the plugin's devices. On
``kubelet.sock`` that is the plugin noticing the restart and registering again; on the
plugin watcher the plugin does nothing at all: the new kubelet finds the socket (its first
reconcile runs at start).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path

from bench.serving import spawn_units
from bench.serving import stop as _stop
from bench.table import Row, median, ms
from compat_tests.kubelet import KubeletEmulator

RESOURCE = "b-com.com/accelerator"
ROUNDS = 10


async def _restarts(directory: Path, registration: str) -> list[float]:
    registry = directory / "plugins_registry"
    registry.mkdir()
    process = spawn_units(directory, 4, "--registration", registration,
                          "--plugins-registry-dir", str(registry))
    figures = []
    try:
        kubelet = KubeletEmulator(directory, "1.32", plugins_registry=registry)
        await kubelet.start()
        await kubelet.wait_for_devices(RESOURCE, timeout=30)
        for _ in range(ROUNDS):
            await kubelet.stop()
            kubelet = KubeletEmulator(directory, "1.32", plugins_registry=registry)
            began = time.perf_counter()
            await kubelet.start()
            await kubelet.wait_for_devices(RESOURCE, timeout=30)
            figures.append(time.perf_counter() - began)
        channels = {r.channel for r in kubelet.registrations}
        if channels != {"kubelet.sock" if registration == "kubelet-socket" else registration}:
            raise RuntimeError(f"{registration}: registered through {channels}")
        await kubelet.stop()
    finally:
        _stop(process)
    return figures


def run() -> list[Row]:
    rows = []
    for registration in ("kubelet-socket", "plugin-watcher"):
        directory = Path(tempfile.mkdtemp(prefix="dpreg", dir="/tmp"))
        try:
            figures = asyncio.run(_restarts(directory, registration))
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        rows.append(Row(f"kubelet restart to devices held, {registration}",
                        ms(median(figures)), "< 1 s",
                        f"median of {ROUNDS}, max {ms(max(figures))}; "
                        + ("the plugin registers again" if registration == "kubelet-socket"
                           else "no plugin action: the kubelet finds the socket")))
    return rows


if __name__ == "__main__":
    from bench.table import render

    print(render(run()))
