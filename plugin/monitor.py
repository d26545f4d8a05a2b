"""Keeps the node's device snapshot current: scan on events, and now and then regardless.

A backend only knows how to scan. This module decides when: once at start; whenever a
watched directory changes (device nodes created or removed) or the kernel announces a device
(uevents); whenever one of the few files that decide health but give no event (a port's
``afu_id`` and error register) reads differently, checked every ``health_interval``; and
every ``rescan_interval`` as the safety net for everything else. Bursts of events are folded
into one scan. Scans and reads run in a worker thread so sysfs never stalls the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path

from plugin.backends.base import Backend
from plugin.dirwatch import DirectoryWatcher
from plugin.model import Device, DeviceSet

log = logging.getLogger(__name__)

Publish = Callable[[DeviceSet], Awaitable[None]]
TriggerSource = Callable[[], AsyncIterator[str]]

DEBOUNCE_SECONDS = 0.02


class DeviceMonitor:
    def __init__(
        self,
        backend: Backend,
        rescan_interval: float,
        triggers: Sequence[TriggerSource] = (),
        health_interval: float = 0.5,
    ) -> None:
        self.backend = backend
        self.rescan_interval = rescan_interval
        self.health_interval = health_interval
        self._health_reading: tuple[bytes | None, ...] = ()
        self.triggers = list(triggers)
        self._wake = asyncio.Event()
        self._last: DeviceSet | None = None

    async def scan(self) -> DeviceSet:
        """One scan, never raising: a failing backend keeps the previous snapshot."""
        try:
            devices = await asyncio.to_thread(self._scan_and_read_health)
            return _dedupe(devices, self.backend.name)
        except Exception:
            log.exception("%s discovery failed; keeping the previous device list",
                          self.backend.name)
            return self._last if self._last is not None else DeviceSet.of(())

    def _scan_and_read_health(self) -> list[Device]:
        devices = self.backend.scan()
        self._health_reading = _read_all(self._health_files())
        return devices

    def _health_files(self) -> list[Path]:
        files = getattr(self.backend, "health_files", None)
        return list(files()) if files is not None else []

    async def _follow_health(self) -> None:
        """Re-read only the health files between scans; a difference wakes a full scan."""
        while True:
            await asyncio.sleep(self.health_interval)
            files = self._health_files()
            if not files:
                continue
            reading = await asyncio.to_thread(_read_all, files)
            if reading != self._health_reading:
                self._health_reading = reading
                log.debug("rescan: a health attribute changed")
                self._wake.set()

    async def run(self, publish: Publish) -> None:
        """Publish the first snapshot, then every changed one, until cancelled."""
        snapshot = await self.scan()
        self._announce(snapshot)
        await publish(snapshot)
        if self.backend.static:
            return
        watcher = DirectoryWatcher()
        tasks = [asyncio.create_task(self._follow_dirs(watcher)),
                 asyncio.create_task(self._follow_health())]
        tasks += [asyncio.create_task(self._follow(source)) for source in self.triggers]
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.rescan_interval)
                    await asyncio.sleep(DEBOUNCE_SECONDS)
                self._wake.clear()
                self._watch_paths(watcher)
                snapshot = await self.scan()
                if snapshot != self._last:
                    self._announce(snapshot)
                    await publish(snapshot)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            watcher.close()

    def request_scan(self, reason: str) -> None:
        """Scan again soon (SIGHUP, SIGUSR1), as if a watched directory had changed."""
        log.debug("rescan: %s", reason)
        self._wake.set()

    def _announce(self, snapshot: DeviceSet) -> None:
        if self._last is None:
            if len(snapshot) == 0:
                log.warning("%s backend found no accelerators on this node; serving zero "
                            "devices and watching for some to appear", self.backend.name)
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
        for path in self.backend.watch_paths():
            watcher.watch(path)

    async def _follow_dirs(self, watcher: DirectoryWatcher) -> None:
        self._watch_paths(watcher)
        async for event in watcher.events():
            log.debug("rescan: %s %s in %s", event.change, event.name, event.directory)
            self._wake.set()

    async def _follow(self, source: TriggerSource) -> None:
        async for reason in source():
            log.debug("rescan: %s", reason)
            self._wake.set()


def _read_all(files: Sequence[Path]) -> tuple[bytes | None, ...]:
    """Contents of each file (its first 4 KiB), None where it cannot be read."""
    contents: list[bytes | None] = []
    for path in files:
        try:
            with open(path, "rb") as handle:
                contents.append(handle.read(4096))
        except OSError:
            contents.append(None)
    return tuple(contents)


def _dedupe(devices: Sequence[Device], backend: str) -> DeviceSet:
    unique: dict[str, Device] = {}
    for device in devices:
        if device.id in unique:
            log.warning("%s reported device %s twice; keeping the first", backend, device.id)
            continue
        unique[device.id] = device
    return DeviceSet.of(unique.values())
