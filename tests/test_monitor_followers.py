"""The monitor's followers (uevents, device-node watcher, health re-read) never die quietly."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest

from plugin.backends.base import Deviceless
from plugin.model import Device, DeviceSet
from plugin.monitor import DeviceMonitor


class CountingBackend(Deviceless):
    name = "counting"
    static = False

    def __init__(self) -> None:
        self.scans = 0

    def scan(self) -> list[Device]:
        self.scans += 1
        return [Device(id="0", backend=self.name)]


async def test_a_failing_uevent_listener_is_logged_and_restarted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    starts = 0

    async def flaky_uevents() -> AsyncIterator[str]:
        nonlocal starts
        starts += 1
        yield f"add pci (listener start {starts})"
        if starts == 1:
            raise OSError("uevent socket failed")
        await asyncio.Event().wait()

    backend = CountingBackend()
    monitor = DeviceMonitor(backend, rescan_interval=3600, triggers=[flaky_uevents])

    async def publish(_devices: DeviceSet) -> None:
        return None

    caplog.set_level(logging.INFO)
    task = asyncio.create_task(monitor.run(publish))
    try:
        for _ in range(100):
            if starts >= 2 and backend.scans >= 3:
                break
            await asyncio.sleep(0.02)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert starts == 2, "restarted once after it failed"
    assert backend.scans >= 3, "both listener runs woke a scan"
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("uevent listener 1 failed: uevent socket failed; restarting" in m
               for m in errors), errors


async def test_a_backend_failing_to_list_its_health_files_does_not_stop_the_re_reads(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Moody(CountingBackend):
        calls = 0

        def health_files(self):  # type: ignore[override]
            Moody.calls += 1
            if Moody.calls == 2:  # the first call is the scan's own
                raise RuntimeError("driver went away mid-listing")
            return []

    monitor = DeviceMonitor(Moody(), rescan_interval=3600, health_interval=0.05)

    async def publish(_devices: DeviceSet) -> None:
        return None

    task = asyncio.create_task(monitor.run(publish))
    try:
        for _ in range(100):
            if Moody.calls >= 5:
                break
            await asyncio.sleep(0.02)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert Moody.calls >= 5, "re-reads went on after the failure"
    assert any("health re-read failed" in r.getMessage() for r in caplog.records
               if r.levelno == logging.ERROR)
