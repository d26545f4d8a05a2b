"""The device monitor when sysfs does not answer: it says what is stuck, reports the devices
Unhealthy past the stall timeout, queues nothing behind the stuck call, recovers when the
call returns, and never keeps the process from exiting."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from compat_tests.fake_sysfs import FakeNode
from plugin.discovery.backends.base import Deviceless
from plugin.discovery.backends.intel import IntelBackend
from plugin.discovery.monitor import DeviceMonitor
from value_types.devices import Device, DeviceSet

PATIENCE = 10.0
EXIT_PATIENCE = 60.0
"""How long a process whose scan hangs gets to exit: generous, since a process that cannot
exit never does; how fast serve stops with a read hanging is bench/stopping.py's."""
JOB_BEFORE_HANG = 0.05
"""A stall is timed from the start of the job that hangs, which may be handed to the worker
just before the test closes the gate: the test's clock starts a little late."""


class GatedBackend(Deviceless):
    """Two healthy devices; a scan hangs while the gate is closed, as a wedged read would."""

    name = "gated"
    static = False

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.scans = 0
        self.hanging = 0
        self.threads: set[int] = set()
        """The threads scans ran on: the event loop's must not be one, or a hang blocks it."""

    def scan(self) -> list[Device]:
        self.scans += 1
        self.threads.add(threading.get_ident())
        if not self.gate.is_set():
            self.hanging += 1
            self.gate.wait()
            self.hanging -= 1
        return [Device(id="0000:5e:00.0", backend=self.name, numa_node=0),
                Device(id="0000:d8:00.0", backend=self.name, numa_node=1)]



@contextlib.asynccontextmanager
async def monitoring(monitor: DeviceMonitor) -> AsyncIterator[asyncio.Queue[DeviceSet]]:
    snapshots: asyncio.Queue[DeviceSet] = asyncio.Queue()

    async def publish(devices: DeviceSet) -> None:
        await snapshots.put(devices)

    task = asyncio.create_task(monitor.run(publish))
    try:
        yield snapshots
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def next_snapshot(snapshots: asyncio.Queue[DeviceSet]) -> DeviceSet:
    return await asyncio.wait_for(snapshots.get(), PATIENCE)


async def test_a_stuck_scan_is_named_then_reported_unhealthy_then_recovered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = GatedBackend()
    monitor = DeviceMonitor(backend, rescan_interval=0.05, health_interval=0.05,
                            stall_timeout=0.6)
    caplog.set_level(logging.INFO, logger="plugin.discovery.monitor")
    async with monitoring(monitor) as snapshots:
        first = await next_snapshot(snapshots)
        assert first.healthy_ids() == ("0000:5e:00.0", "0000:d8:00.0")

        backend.gate.clear()
        hung_at = time.monotonic()
        stalled = await next_snapshot(snapshots)
        assert time.monotonic() - hung_at >= 0.6 - JOB_BEFORE_HANG
        assert stalled.ids == first.ids and stalled.healthy_ids() == ()
        assert all("discovery stalled" in d.health_reason and "gated discovery scan"
                   in d.health_reason for d in stalled)
        assert [d.numa_node for d in stalled] == [0, 1]
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert any("gated discovery scan has not returned" in m for m in errors), errors

        # While it hangs: the loop answers, and nothing piles up behind the stuck call.
        threads, scans = threading.active_count(), backend.scans
        await asyncio.sleep(0.5)  # ten rescan and health intervals
        assert threading.get_ident() not in backend.threads, "a scan ran on the event loop"
        assert (threading.active_count(), backend.scans, backend.hanging) == (threads, scans, 1)
        assert snapshots.empty(), "the stalled state is published once"

        backend.gate.set()
        recovered = await next_snapshot(snapshots)
        assert recovered == first
        assert any("answers again" in r.getMessage() for r in caplog.records)


async def test_a_short_hang_below_the_timeout_changes_nothing() -> None:
    backend = GatedBackend()
    monitor = DeviceMonitor(backend, rescan_interval=0.05, health_interval=0.05,
                            stall_timeout=2.0)
    async with monitoring(monitor) as snapshots:
        await next_snapshot(snapshots)
        backend.gate.clear()
        await asyncio.sleep(0.3)
        backend.gate.set()
        await asyncio.sleep(0.3)
        assert snapshots.empty()


async def test_health_files_that_are_fifos_are_read_without_blocking(
    tmp_path: Path,
) -> None:
    node = FakeNode(tmp_path)
    [port] = node.add_opae_card("0000:5e:00.0")
    fifos = [node.port_path(port) / "afu_id", node.port_path(port) / "errors" / "errors"]
    for fifo in fifos:
        fifo.unlink()
        os.mkfifo(fifo)
    monitor = DeviceMonitor(IntelBackend(node.config()), rescan_interval=3600,
                            health_interval=0.05)
    try:
        async with monitoring(monitor) as snapshots:
            first = await next_snapshot(snapshots)
            device = first.get("0000:5e:00.0")
            assert device is not None and not device.healthy
            assert "not a regular file" in device.health_reason
            # The FIFO goes back to being an attribute: the re-read notices, no event needed.
            for fifo in fifos:
                fifo.unlink()
            node.set_port_error(port, 0)
            node.set_afu_id(port, "d8424dc4a4a3c413f89e433683f9040b")
            again = await next_snapshot(snapshots)
            assert again.healthy_ids() == ("0000:5e:00.0",)
    finally:
        release(fifos)


def release(fifos: list[Path]) -> None:
    """Were a reader blocked on one of these FIFOs, let it go, so a failed test still ends."""
    for _ in range(40):
        left = [f for f in fifos if f.exists() and stat.S_ISFIFO(f.stat().st_mode)]
        if not left:
            return
        for fifo in left:
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        time.sleep(0.05)
    for fifo in fifos:
        fifo.unlink(missing_ok=True)


HANG_THEN_EXIT = textwrap.dedent("""
    import asyncio, threading, sys
    from plugin.discovery.backends.base import Deviceless
    from value_types.devices import Device
    from plugin.discovery.monitor import DeviceMonitor

    class Forever(Deviceless):
        name, static = "forever", False
        def __init__(self):
            self.calls = 0
        def scan(self):
            self.calls += 1
            if self.calls > 1:
                threading.Event().wait()  # a read that never returns
            return [Device(id="0", backend="forever")]

    async def main():
        published = []
        async def publish(devices):
            published.append(devices)
        task = asyncio.create_task(DeviceMonitor(
            Forever(), rescan_interval=0.05, stall_timeout=0.2).run(publish))
        while len(published) < 2:
            await asyncio.sleep(0.05)
        assert not published[1].get("0").healthy
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        print("stopping", flush=True)
        return 0

    sys.exit(asyncio.run(main()))
""")


def test_the_process_exits_while_a_scan_hangs() -> None:
    try:
        done = subprocess.run([sys.executable, "-c", HANG_THEN_EXIT], capture_output=True,
                              text=True, timeout=EXIT_PATIENCE)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"did not exit while a scan hangs: {exc.stdout!r}") from None
    assert done.returncode == 0, done.stderr
    assert "stopping" in done.stdout


async def test_a_stuck_health_re_read_with_no_scan_behind_it_is_caught_by_the_watchdog(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """The re-read is the worker's own call, so no coroutine waits on it: still named, still
    reported Unhealthy past the stall timeout, and the real state returns once it does."""
    afu_id = tmp_path / "afu_id"
    afu_id.write_text("one\n")

    class Listed(GatedBackend):
        def health_files(self) -> list[Path]:
            return [afu_id]

    backend = Listed()
    monitor = DeviceMonitor(backend, rescan_interval=3600, health_interval=0.05,
                            stall_timeout=0.6)
    gate = threading.Event()
    real = monitor._health.changed

    def hanging() -> bool:
        gate.wait()
        return real()

    caplog.set_level(logging.INFO)
    async with monitoring(monitor) as snapshots:
        first = await next_snapshot(snapshots)
        assert first.healthy_ids() == ("0000:5e:00.0", "0000:d8:00.0")
        monitor._health.changed = hanging  # type: ignore[method-assign]
        began = time.monotonic()
        stalled = await next_snapshot(snapshots)
        assert time.monotonic() - began >= 0.5
        assert stalled.ids == first.ids and stalled.healthy_ids() == ()
        assert all("health re-read" in d.health_reason for d in stalled)
        assert backend.scans == 1, "the rescan interval is an hour: the watchdog found it"
        monitor._health.changed = real  # type: ignore[method-assign]
        gate.set()
        recovered = await next_snapshot(snapshots)
        assert recovered.healthy_ids() == first.healthy_ids()
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("health re-read has not returned" in m for m in errors), errors
