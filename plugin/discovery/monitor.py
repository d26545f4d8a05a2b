"""Keeps the node's device snapshot current: scan on events, and now and then regardless.

A backend only knows how to scan. This module decides when: once at start; whenever a
watched directory changes (device nodes created or removed) or the kernel announces a device
(uevents); whenever one of the few files that decide health but give no event (a port's
``afu_id`` and error register) reads differently, checked every ``health_interval``; and
now and then as the safety net for everything else. Bursts of events are folded into one
scan.

How often the safety net runs depends on whether the monitor can hear changes. While every
event source is listening (the uevent socket is bound, inotify works) a full rescan only
catches what an event missed, and runs every 30 s; while one cannot listen, rescans are how
hot-plug is found, and run every 5 s. An explicit ``rescan_interval`` overrides both.

Scans and health re-reads run one at a time on a worker thread of their own (see
:mod:`plugin.discovery.worker`), so sysfs never stalls the event loop, a read that never returns
cannot stop the process from exiting, and no second read is queued behind a stuck one. The
re-reads are the worker's own idle-time call, on files kept open since the last scan
(:mod:`plugin.discovery.backends.rereads`), so an idle monitor wakes one thread per tick and the
event loop only when a file changed. A watchdog names a call that takes too long; past
``stall_timeout`` it reports every device Unhealthy, because a node whose health checking is
stuck must not keep advertising Healthy, and the next scan that completes puts the real state
back.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from plugin.discovery.backends.base import Backend
from plugin.discovery.backends.rereads import KeptFiles
from plugin.discovery.backends.sysfs import reading_now
from plugin.discovery.worker import BlockingWorker, Job, Periodic
from plugin.process.dirwatch import DirectoryWatcher
from plugin.process.supervise import supervise
from plugin.process.ticks import sleep_to_tick, tick_deadline
from value_types.devices import Device, DeviceSet, Health

log = logging.getLogger(__name__)

Publish = Callable[[DeviceSet], Awaitable[None]]
TriggerSource = Callable[[], AsyncIterator[str]]
T = TypeVar("T")

LISTENING = "\0listening"
"""Yielded by a trigger source once it can hear its events: not a change, a state. A source
is taken as deaf from its start until it says this, and again once it ends."""

DEBOUNCE_SECONDS = 0.02
SAFETY_NET_RESCAN_SECONDS = 30.0
"""Default time between full rescans while every event source listens: they only catch what
an event missed (a netlink overflow the kernel could not even report, say)."""
DEAF_RESCAN_SECONDS = 5.0
"""Default time between full rescans while an event source cannot listen: they are then how
hot-plug is found, so they run at the pace device plugins traditionally poll at."""
WATCHDOG_SECONDS = 5.0
"""Period of the re-read watchdog (at most half the stall timeout), on the same 5 s grid as
the other slow loops so that they wake the process together."""
STALL_TIMEOUT_SECONDS = 10.0
"""Default time a scan or re-read may take before the devices are reported Unhealthy."""
SLOW_CALL_SECONDS = 2.0
"""A call this slow is logged as an error (at half the stall timeout if that is shorter);
the 256-port scan takes about 50 ms."""


class DeviceMonitor:
    def __init__(
        self,
        backend: Backend,
        rescan_interval: float | None = None,
        triggers: Sequence[TriggerSource] = (),
        health_interval: float = 0.5,
        stall_timeout: float = STALL_TIMEOUT_SECONDS,
    ) -> None:
        self.backend = backend
        self.rescan_interval = rescan_interval
        self.health_interval = health_interval
        self.stall_timeout = stall_timeout
        self._health = KeptFiles()
        """The health files of the last scan, kept open while the monitor runs."""
        self._loop: asyncio.AbstractEventLoop | None = None
        """Set while :meth:`run` runs: re-reads then keep files open and wake it on a change."""
        self.triggers = list(triggers)
        self._wake = asyncio.Event()
        self._last: DeviceSet | None = None
        self._worker = BlockingWorker(f"{backend.name}-discovery")
        self._sysfs = asyncio.Lock()
        """Held while a call is on the worker: nothing is queued behind a stuck one."""
        self._publishing = asyncio.Lock()
        self._stalled: Job | None = None
        """The call that made the monitor report every device Unhealthy, until a scan ends."""
        self._publish: Publish | None = None
        self._deaf: set[str] = set()
        """Event sources not listening now; while any is, rescans run every few seconds."""
        self._pace: tuple[float, frozenset[str]] | None = None
        """The rescan period and deaf sources last announced."""

    async def scan(self) -> DeviceSet:
        """One scan, never raising: a failing backend keeps the previous snapshot."""
        try:
            async with self._sysfs:
                devices = await self._watched(f"{self.backend.name} discovery scan",
                                              self._scan_and_read_health)
            return _dedupe(devices, self.backend.name)
        except Exception:
            log.exception("%s discovery failed; keeping the previous device list",
                          self.backend.name)
            return self._last if self._last is not None else DeviceSet.of(())

    def _scan_and_read_health(self) -> list[Device]:
        devices = self.backend.scan()
        if self._loop is not None:
            self._health.reset(self._health_files())
        return devices

    def _health_files(self) -> list[Path]:
        """What the worker re-reads until the next scan; nothing if the backend cannot say."""
        try:
            return self.backend.health_files()
        except Exception:
            log.exception("%s backend cannot list its health files; they are not re-read "
                          "until the next scan", self.backend.name)
            return []

    @property
    def _reread_name(self) -> str:
        return f"{self.backend.name} health re-read"

    def _reread(self) -> None:
        """On the worker, every ``health_interval`` of idleness: a changed file wakes a scan."""
        loop = self._loop
        if loop is not None and self._health.changed():
            log.debug("rescan: a health attribute changed")
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._wake.set)

    async def _watch_rereads(self) -> None:
        """The watchdog of the worker's own re-reads, which no coroutine waits on.

        Calls made from the loop are watched by :meth:`_watched`; a re-read stuck with no
        such call behind it is found here, one check every ``min(5 s, stall_timeout / 2)``
        on the shared tick, and one more exactly when a re-read seen running reaches the
        stall timeout, so the devices turn Unhealthy on time and not up to a tick later.
        """
        loop = asyncio.get_running_loop()
        every = min(WATCHDOG_SECONDS, self.stall_timeout / 2)
        named: Job | None = None
        job: Job | None = None
        while True:
            to_stall = self.stall_timeout - job.age() if job is not None else 0.0
            if job is not None and job.what == self._reread_name and to_stall > 0:
                await asyncio.sleep(min(to_stall, tick_deadline(every) - loop.time()))
            else:
                await sleep_to_tick(every)
            job = self._worker.current
            if self._stalled is not None and job is not self._stalled:
                self._wake.set()  # the stuck call returned: rescan to publish the truth
                continue
            if job is None or job.what != self._reread_name or self._sysfs.locked():
                continue
            if job.age() >= self.stall_timeout:
                if self._stalled is None:
                    await self._report_stall(job)
            elif job.age() >= every and job is not named:
                named = job
                log.error("%s has not returned for %.1f s%s; devices are not being updated "
                          "meanwhile", job.what, job.age(), _stuck_on(job))

    async def run(self, publish: Publish) -> None:
        """Publish the first snapshot, then every changed one, until cancelled."""
        self._publish = publish
        if self.backend.static:
            await self._scan_and_publish(publish)
            return
        self._loop = asyncio.get_running_loop()
        self._worker.every(Periodic(self._reread_name, self.health_interval, self._reread,
                                    wanted=lambda: bool(self._health.last)))
        try:
            await self._scan_and_publish(publish)
            await self._follow_changes(publish)
        finally:
            self._loop = None
            self._worker.every(None)
            self._health.close()

    async def _follow_changes(self, publish: Publish) -> None:
        watcher = DirectoryWatcher()
        # Each follower runs supervised: one that fails or ends (a uevent socket error, a
        # backend raising while listing its health files) is logged and restarted instead
        # of leaving the monitor deaf to that kind of change.
        followers: dict[str, Callable[[], Awaitable[None]]] = {
            "device-node watcher": lambda: self._follow_dirs(watcher),
            "health re-read watchdog": self._watch_rereads,
        }
        for number, source in enumerate(self.triggers, start=1):
            name = f"uevent listener {number}"
            followers[name] = functools.partial(self._follow, name, source)
            self._deaf.add(name)  # until it says it listens
        if not watcher.available:  # said once already by the watcher
            self._deaf.add("inotify")
        tasks = [asyncio.create_task(supervise(name, follow), name=name)
                 for name, follow in followers.items()]
        await asyncio.sleep(0)  # each follower's first step: a bound socket says LISTENING
        try:
            while True:
                self._announce_pace()
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a
                # cancellation that arrives as the event is set, and the loop never ends.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(tick_deadline(self.rescan_period())):
                        await self._wake.wait()
                    await asyncio.sleep(DEBOUNCE_SECONDS)
                self._wake.clear()
                self._watch_paths(watcher)
                await self._scan_and_publish(publish)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            watcher.close()

    def rescan_period(self) -> float:
        """Time between safety-net rescans now: as told, else by whether changes are heard."""
        if self.rescan_interval is not None:
            return self.rescan_interval
        return DEAF_RESCAN_SECONDS if self._deaf else SAFETY_NET_RESCAN_SECONDS

    def _hear(self, source: str, listening: bool) -> None:
        """Record whether ``source`` can hear changes. One that stops wakes a rescan: it may
        have missed something while it was failing, and the pace changes from now."""
        if listening:
            self._deaf.discard(source)
        elif source not in self._deaf:
            self._deaf.add(source)
            self._wake.set()

    def _announce_pace(self) -> None:
        """Say how often rescans run, and why, each time that changes (and once at start)."""
        pace = (self.rescan_period(), frozenset(self._deaf))
        if pace == self._pace or self.rescan_interval is not None:
            self._pace = pace
            return
        self._pace = pace
        if self._deaf:
            log.warning("rescanning every %g s while %s cannot hear changes",
                        DEAF_RESCAN_SECONDS, " and ".join(sorted(self._deaf)))
        else:
            log.info("every event source is listening; full rescans every %g s as a safety "
                     "net", SAFETY_NET_RESCAN_SECONDS)

    def request_scan(self, reason: str) -> None:
        """Scan again soon (SIGHUP, SIGUSR1), as if a watched directory had changed."""
        log.debug("rescan: %s", reason)
        self._wake.set()

    async def _scan_and_publish(self, publish: Publish) -> None:
        snapshot = await self.scan()
        async with self._publishing:
            changed = self._last is None or snapshot != self._last
            if changed:
                self._announce(snapshot)
            stalled, self._stalled = self._stalled, None
            if stalled is not None:
                log.warning("discovery answers again (%s had stalled for %.1f s); the devices "
                            "are reported as found", stalled.what, stalled.age())
            if changed or stalled is not None:
                await publish(snapshot)

    async def _watched(self, what: str, call: Callable[[], T]) -> T:
        """Run a blocking sysfs call on the worker, under the watchdog.

        The watchdog is the waiting itself, so an idle monitor pays nothing for it: a call
        slower than ``min(2 s, half the stall timeout)`` is named in an error, one that
        reaches the stall timeout makes every device Unhealthy, and once it returns a rescan
        publishes the real state.
        """
        call_done = asyncio.ensure_future(self._worker.run(what, call))
        slow_after = min(SLOW_CALL_SECONDS, self.stall_timeout / 2)
        try:
            done, _ = await asyncio.wait({call_done}, timeout=slow_after)
            job = self._worker.current
            if not done and job is not None:
                log.error("%s has not returned for %.1f s%s; devices are not being updated "
                          "meanwhile", job.what, job.age(), _stuck_on(job))
                done, _ = await asyncio.wait({call_done}, timeout=self.stall_timeout - job.age())
                if not done and self._stalled is None:
                    await self._report_stall(job)
            result = await call_done
        except asyncio.CancelledError:
            call_done.cancel()
            raise
        if self._stalled is not None:
            self._wake.set()  # the stuck call returned: rescan to publish the truth
        return result

    async def _report_stall(self, job: Job) -> None:
        async with self._publishing:
            if self._worker.current is not job:
                return  # it returned while the lock was awaited
            self._stalled = job
            reason = (f"device discovery stalled: {job.what} has not returned for "
                      f"{job.age():.0f} s{_stuck_on(job)}")
            if self._last is None:
                log.error("%s; no device list has been published yet", reason)
                return
            log.error("%s; reporting all %d devices Unhealthy until it completes",
                      reason, len(self._last))
            if self._publish is not None:
                await self._publish(DeviceSet.of(
                    replace(d, health=Health.UNHEALTHY, health_reason=reason) for d in self._last))

    def _announce(self, snapshot: DeviceSet) -> None:
        if self._last is None:
            if len(snapshot) == 0:
                log.warning("%s backend found no accelerators on this node; watching for "
                            "some to appear", self.backend.name)
            else:
                log.info("%s backend found %d devices: %s", self.backend.name, len(snapshot),
                         ", ".join(snapshot.ids))
        else:
            log.info("devices changed: %s", self._last.diff(snapshot).describe())
        for device in snapshot:
            previous = self._last.get(device.id) if self._last is not None else None
            if not device.healthy and (previous is None or previous.healthy):
                log.warning("device %s is unhealthy: %s", device.id, device.health_reason)
            elif device.healthy and previous is not None and not previous.healthy:
                log.info("device %s is healthy again", device.id)
        self._last = snapshot

    def _watch_paths(self, watcher: DirectoryWatcher) -> None:
        """Watch the backend's directories; one that exists and cannot be watched (the
        node's inotify watch limit is reached, say) makes the monitor rescan often."""
        refused = [path for path in self.backend.watch_paths()
                   if not watcher.watch(path) and watcher.refusal(path) is not None]
        if watcher.available:
            self._hear("inotify", not refused)

    async def _follow_dirs(self, watcher: DirectoryWatcher) -> None:
        self._watch_paths(watcher)
        if not watcher.available:  # said once already; rescans do the work
            await asyncio.Event().wait()
        async for event in watcher.events():
            log.debug("rescan: %s %s in %s", event.change, event.name, event.directory)
            self._wake.set()

    async def _follow(self, name: str, source: TriggerSource) -> None:
        try:
            async for reason in source():
                if reason == LISTENING:
                    self._hear(name, True)
                    continue
                log.debug("rescan: %s", reason)
                self._wake.set()
        except asyncio.CancelledError:
            self._deaf.add(name)  # the monitor is stopping: nothing to tell
            raise
        except BaseException:
            self._hear(name, False)
            raise
        self._hear(name, False)  # it ended; its supervisor says so and starts it again


def _stuck_on(job: Job) -> str:
    path = reading_now(job.thread_id)
    return f" (reading {path})" if path is not None else ""


def _dedupe(devices: Sequence[Device], backend: str) -> DeviceSet:
    unique: dict[str, Device] = {}
    for device in devices:
        if device.id in unique:
            log.warning("%s reported device %s twice; keeping the first", backend, device.id)
            continue
        unique[device.id] = device
    return DeviceSet.of(unique.values())
