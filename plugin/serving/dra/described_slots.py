"""What each AWS slot holds, as its SDK's describe last said, for ``functionGuarded``.

Discovery reads an Intel port's AFU and an Alveo card's xclbin from sysfs, so the publisher
knows at once whether they hold a guarded function. An AWS slot's AGFI is known only to the
SDK (``fpga-describe-local-image``, a process per slot, through the loader when there is
one), so it is asked here, off the publishing path: for each slot the publisher asks about,
again for every slot after a load or a clear ends (:meth:`stale`), and every
:data:`REDESCRIBE_INTERVAL` seconds, for a load made by hand outside this driver. Until a
slot has been described, and while its describe fails, it may hold any function of its
family: :class:`~.function_grants.FunctionGrants` then publishes it guarded whenever a
function of its family is (failing closed, as the check at prepare does), so a tenant on
the plain class is steered to slots known to hold nothing guarded instead of being refused
at prepare. While no function of a slot's family is guarded, the slot is not described at
all, and what was read of it is forgotten: by the time one is guarded again it may be stale.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable

from plugin.programming.guarded import Function, Unread
from value_types.devices import Device

log = logging.getLogger(__name__)

REDESCRIBE_INTERVAL = 60.0
"""Seconds between two describes of a slot nothing here changed."""
NOT_DESCRIBED = "its SDK has not described it yet"

Held = Callable[[str], Awaitable[Function | Unread | None]]


class DescribedSlots:
    """The last describe of each slot asked about; :attr:`generation` counts its changes."""

    def __init__(self, held: Held, on_changed: Callable[[], None],
                 needed: Callable[[str], bool]) -> None:
        self._held = held
        self._on_changed = on_changed
        self._needed = needed
        """Family -> whether its slots must be described now (a function of it is guarded):
        the others are not described, and forgotten, to be described afresh when needed."""
        self.known: dict[str, Function | Unread | None] = {}
        self.generation = 0
        """Bumped whenever a slot's reading changes: the pool is built again."""
        self._families: dict[str, str] = {}
        """Slot -> its family, for every slot asked about."""
        self._wanted: set[str] = set()
        """Slots to describe at the next turn."""
        self._wake: asyncio.Event | None = None

    def held(self, device: Device) -> Function | Unread | None:
        """What ``device`` was last described to hold; until it has been, Unread, and a
        describe is asked for."""
        if device.id in self.known:
            return self.known[device.id]
        self._families[device.id] = device.backend
        self._want([device.id])
        return Unread(device.backend, NOT_DESCRIBED)

    def stale(self) -> None:
        """A load or a clear ended: what any slot holds may have changed."""
        self._want(self.known)

    def _want(self, slots: Iterable[str]) -> None:
        before = len(self._wanted)
        self._wanted.update(slots)
        if len(self._wanted) == before:
            return
        if self._wake is not None:
            self._wake.set()

    async def run(self, interval: float = REDESCRIBE_INTERVAL) -> None:
        """Describe what is asked for, and every known slot each ``interval``, until
        cancelled."""
        self._wake = wake = asyncio.Event()
        if self._wanted:
            wake.set()
        while True:
            try:
                async with asyncio.timeout(interval):
                    await wake.wait()
            except TimeoutError:
                self.stale()
            wake.clear()
            wanted, self._wanted = self._wanted, set()
            if await self._describe(sorted(wanted)):
                self.generation += 1
                self._on_changed()

    async def _describe(self, slots: Iterable[str]) -> bool:
        changed = False
        for slot in slots:
            if not self._needed(self._families[slot]):
                self.known.pop(slot, None)  # maybe stale by the time it is needed again
                continue
            try:
                found = await self._held(slot)
            except Exception as exc:  # a bug here must not stop the describes; fail closed
                log.exception("cannot describe %s", slot)
                found = Unread(self._families[slot], f"describing it failed: {exc}")
            if slot not in self.known or self.known[slot] != found:
                changed = True
                self.known[slot] = found
        return changed

