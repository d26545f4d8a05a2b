"""How often the monitor rescans on its own: seldom while it can hear changes, often while
it cannot, and as told when told."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest

from plugin.discovery import monitor as monitor_module
from plugin.discovery.monitor import LISTENING, DeviceMonitor
from tests.test_monitor_followers import CountingBackend
from value_types.devices import DeviceSet

SAFETY_NET = 0.6
DEAF = 0.1
WATCHED_FOR = 1.25


@pytest.fixture(autouse=True)
def short_paces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(monitor_module, "SAFETY_NET_RESCAN_SECONDS", SAFETY_NET)
    monkeypatch.setattr(monitor_module, "DEAF_RESCAN_SECONDS", DEAF)


async def listening() -> AsyncIterator[str]:
    yield LISTENING
    await asyncio.Event().wait()


async def never_listening() -> AsyncIterator[str]:
    await asyncio.Event().wait()
    yield "unreachable"


async def scans_over(monitor: DeviceMonitor, backend: CountingBackend, seconds: float) -> int:
    async def publish(_devices: DeviceSet) -> None:
        return None

    task = asyncio.create_task(monitor.run(publish))
    try:
        await asyncio.sleep(seconds)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return backend.scans


async def test_while_every_source_listens_rescans_are_only_a_slow_safety_net(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = CountingBackend()
    caplog.set_level(logging.INFO)
    scans = await scans_over(DeviceMonitor(backend, triggers=[listening]), backend, WATCHED_FOR)
    # the first scan, then one or two safety-net rescans in 1.25 s at 0.6 s; at the deaf
    # pace it would be about a dozen
    assert 2 <= scans <= 4, scans
    assert any("every event source is listening; full rescans every 0.6 s" in r.getMessage()
               for r in caplog.records)


async def test_a_source_that_cannot_listen_keeps_rescans_at_the_short_pace() -> None:
    backend = CountingBackend()
    scans = await scans_over(DeviceMonitor(backend, triggers=[listening, never_listening]),
                             backend, WATCHED_FOR)
    assert scans >= 8, scans


async def test_a_source_that_stops_listening_brings_the_short_pace_back_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def listens_then_fails() -> AsyncIterator[str]:
        yield LISTENING
        await asyncio.sleep(0.2)
        raise OSError("uevent socket failed")

    starts = 0

    def source() -> AsyncIterator[str]:
        nonlocal starts
        starts += 1
        return listens_then_fails() if starts == 1 else never_listening()

    backend = CountingBackend()
    caplog.set_level(logging.INFO)
    scans = await scans_over(DeviceMonitor(backend, triggers=[source]), backend, WATCHED_FOR)
    assert scans >= 6, scans
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("rescanning every 0.1 s while uevent listener 1 cannot hear changes" in m
               for m in warnings), warnings


async def test_an_explicit_interval_is_used_whatever_the_sources_say() -> None:
    backend = CountingBackend()
    scans = await scans_over(DeviceMonitor(backend, rescan_interval=0.1, triggers=[listening]),
                             backend, WATCHED_FOR)
    assert scans >= 8, scans


async def test_stopping_the_monitor_is_not_reported_as_a_deaf_source(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = CountingBackend()
    caplog.set_level(logging.INFO)
    await scans_over(DeviceMonitor(backend, triggers=[listening]), backend, 0.3)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
