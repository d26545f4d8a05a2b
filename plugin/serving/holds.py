"""After a move between the device plugin and DRA: which devices the old API still holds.

A :class:`HoldWatch` is made at each move. :meth:`HoldWatch.first` asks the kubelet's
PodResources API once, bounded (``--pod-resources-socket``; 2 s), before the new API offers
anything, and says once what it found: one log line naming the pods or claims, the
``devices_held_by_other_api`` gauge, and an Event where Events are on. :meth:`HoldWatch.run`
then asks again every ``interval`` (0.5 s) while anything is held, so a device is offered
within a second of its last holder ending, and returns once nothing is.

Failing safe both ways: where the socket is missing, refuses or hangs at the move, the
PodResources part counts as empty (what the plugin did before it asked: offer everything) and
a warning says so once; where it fails while devices are held (a kubelet restarting), the last
answer stands until one comes, since releasing on a failure would hand out a device in use.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from api_versions.podresources import (
    LIST_TIMEOUT,
    Listing,
    PodResourcesUnavailable,
    list_pod_resources,
)
from plugin.model.held import Held
from plugin.process import metrics

log = logging.getLogger(__name__)

POLL_INTERVAL = 0.5

Compute = Callable[[Listing | None, Held], Awaitable[Held]]
"""What is held, from a listing (None: PodResources could not be read) and what was held
until now (so a failed read can keep it: a failure never releases a device)."""


class HoldWatch:
    """See the module docstring. ``changed(held)`` (a function or a coroutine function) is
    called whenever the set changes in :meth:`run`, including to empty; ``say(message)``
    sends the once-per-move Event."""

    def __init__(self, socket: Path, api: str, compute: Compute,
                 changed: Callable[[Held], object], say: Callable[[str], None] | None = None, *,
                 timeout: float = LIST_TIMEOUT, interval: float = POLL_INTERVAL) -> None:
        self.socket = socket
        self.api = api
        self._compute = compute
        self._changed = changed
        self._say = say
        self._timeout = timeout
        self._interval = interval
        self._failure: str | None = None
        self.held = Held(api, {})

    async def _listing(self) -> Listing | None:
        try:
            listing = await list_pod_resources(self.socket, self._timeout)
        except PodResourcesUnavailable as unavailable:
            if unavailable.kind != self._failure:
                self._failure = unavailable.kind
                log.warning("cannot read the kubelet's PodResources API: %s; devices held "
                            "through the other API cannot be told, so every device is offered "
                            "as before (mount the socket's directory to keep them out)",
                            unavailable)
            return None
        if self._failure is not None:
            log.info("the kubelet's PodResources API at %s answers again", self.socket)
            self._failure = None
        return listing

    async def first(self) -> Held:
        """At the move: what is held now, said once."""
        self.held = await self._compute(await self._listing(), self.held)
        metrics.devices_held(self.api, len(self.held.devices))
        if self.held:
            message = (f"{self.held.describe()}; they are not offered through the new API "
                       "until released")
            log.warning("node moved: %s", message)
            if self._say is not None:
                self._say(message)
        return self.held

    async def run(self) -> None:
        """Ask again while anything is held; return once nothing is."""
        while self.held:
            await asyncio.sleep(self._interval)
            now = await self._compute(await self._listing(), self.held)
            released = [d for d in self.held.devices if d not in now]
            if now.devices == self.held.devices:
                continue
            self.held = now
            metrics.devices_held(self.api, len(now.devices))
            if released:
                log.info("released by their last holder, now offered: %s%s",
                         ", ".join(released),
                         "" if now else "; nothing is held through the other API any more")
            result = self._changed(now)
            if inspect.isawaitable(result):
                await result
