"""The monitor's followers (uevents, device-node watcher, health re-read) never die quietly."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from plugin.discovery.backends.base import Deviceless
from plugin.discovery.monitor import DeviceMonitor
from value_types.devices import Device, DeviceSet


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


async def test_a_backend_failing_to_list_its_health_files_loses_only_that_scans_re_reads(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """The scan still publishes; the next scan lists the files again and re-reads resume."""
    afu_id = tmp_path / "afu_id"
    afu_id.write_text("one\n")

    class Moody(CountingBackend):
        listings = 0

        def health_files(self):  # type: ignore[override]
            Moody.listings += 1
            if Moody.listings == 1:
                raise RuntimeError("driver went away mid-listing")
            return [afu_id]

    backend = Moody()
    monitor = DeviceMonitor(backend, rescan_interval=0.3, health_interval=0.05)
    published: list[DeviceSet] = []

    async def publish(devices: DeviceSet) -> None:
        published.append(devices)

    async def until(condition: Callable[[], bool]) -> None:
        for _ in range(200):
            if condition():
                return
            await asyncio.sleep(0.02)
        raise AssertionError("not within 4 s")

    task = asyncio.create_task(monitor.run(publish))
    try:
        await until(lambda: bool(published) and backend.scans >= 2)
        scans = backend.scans
        await asyncio.sleep(0.1)  # re-reads of an unchanged file wake nothing
        assert backend.scans == scans
        afu_id.write_text("two\n")  # in place, as sysfs changes
        await until(lambda: backend.scans > scans)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert published[0].ids == ("0",), "the scan whose listing failed still published"
    assert any("cannot list its health files" in r.getMessage() for r in caplog.records
               if r.levelno == logging.ERROR)


async def test_a_failing_re_read_is_logged_and_tried_again(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    afu_id = tmp_path / "afu_id"
    afu_id.write_text("one\n")

    class Listed(CountingBackend):
        def health_files(self):  # type: ignore[override]
            return [afu_id]

    backend = Listed()
    monitor = DeviceMonitor(backend, rescan_interval=3600, health_interval=0.05)
    failures = 0
    real = monitor._health.changed

    def flaky() -> bool:
        nonlocal failures
        if failures < 2:
            failures += 1
            raise OSError("read went wrong")
        return real()

    monitor._health.changed = flaky  # type: ignore[method-assign]

    async def publish(_devices: DeviceSet) -> None:
        return None

    task = asyncio.create_task(monitor.run(publish))
    try:
        for _ in range(100):
            if failures == 2 and backend.scans == 1:
                break
            await asyncio.sleep(0.02)
        afu_id.write_text("two\n")
        for _ in range(100):
            if backend.scans >= 2:
                break
            await asyncio.sleep(0.02)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert backend.scans >= 2, "re-reads went on after failing, and noticed the change"
    assert any("health re-read failed" in r.getMessage() for r in caplog.records
               if r.levelno == logging.ERROR)
