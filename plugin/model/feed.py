"""The latest device snapshot of one resource, and the streams that follow it.

ListAndWatch needs "the full list now, then again on every change" for any number of
streams from any generation. A feed keeps only the newest snapshot: a slow stream skips
intermediate states and always catches up with the truth, never with a backlog.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from value_types.devices import DeviceSet


class DeviceFeed:
    def __init__(self, initial: DeviceSet | None = None) -> None:
        self._current = initial if initial is not None else DeviceSet.of(())
        self._version = 0
        self._closed = False
        self._changed = asyncio.Condition()

    @property
    def current(self) -> DeviceSet:
        return self._current

    @property
    def closed(self) -> bool:
        return self._closed

    async def publish(self, devices: DeviceSet) -> bool:
        """Make ``devices`` the current snapshot; return whether anything changed."""
        if devices == self._current:
            return False
        async with self._changed:
            self._current = devices
            self._version += 1
            self._changed.notify_all()
        return True

    async def close(self) -> None:
        """End every subscription (the resource is going away or the plugin stops)."""
        async with self._changed:
            self._closed = True
            self._changed.notify_all()

    async def subscribe(self) -> AsyncIterator[DeviceSet]:
        """Yield the current snapshot at once, then each newer one until the feed closes."""
        seen = -1
        while True:
            async with self._changed:
                while not self._closed and self._version == seen:
                    await self._changed.wait()
                if self._closed:
                    return
                seen = self._version
                snapshot = self._current
            yield snapshot
