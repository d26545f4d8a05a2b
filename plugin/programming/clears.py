"""Clears: the function a DeviceClass clears a device to (``clearOnUnprepare``), loaded once
the last claim holding the device is unprepared, and never lost on the way.

The order, which :class:`~plugin.serving.dra.prepare.ClaimPreparer` follows:

1. :meth:`Clears.asked` says which clears an unprepare asks for, and :meth:`Clears.record`
   writes them to the pending record (:mod:`.pending_clears`) **before** the claims leave the
   checkpoint (a record that cannot be written fails the unprepare: the kubelet calls again);
2. the checkpoint entries go; then :meth:`Clears.start` runs each clear after the kubelet's
   answer (or, if the entries could not be removed, :meth:`Clears.forget` drops them again);
3. a clear whose outcome is known (loaded, held already, refused, failed) leaves the record;
   one cut off (the process stopping) stays in it;
4. the next instance (a restart, a rolling update's newcomer), as soon as it holds the
   driver's socket and can read the checkpoint, runs every pending clear whose device no
   recorded claim holds (:meth:`Clears.resume`), before it prepares any claim on that device
   (a claim allocated it meanwhile is refused until the clear is over, and the device is
   published draining). One a recorded claim still holds stays pending: the kubelet will
   unprepare that claim again.

While the driver stops (:meth:`Clears.stop`), an unprepare still records its clears but does
not start them: they are left to the instance that comes next.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from functools import partial
from pathlib import Path

from plugin.programming.function_config import FunctionSpec
from plugin.programming.outcome import Outcome
from plugin.programming.pending_clears import PendingClear, PendingClears
from plugin.programming.vetting import ProgrammingRefused

log = logging.getLogger(__name__)

Holders = Callable[[str], list[str]]
"""Device ID -> the recorded claims holding it now (a clear never loads under one)."""
Ensure = Callable[[str, str, str, FunctionSpec, Holders], Awaitable[Outcome]]
"""The programmer's ``ensure(claim, uid, device_id, spec, holders)``."""


class Clears:
    """The clears of one driver: recorded, run, and resumed after a restart."""

    def __init__(self, ensure: Ensure, state_dir: Path | None,
                 changed: Callable[[], None]) -> None:
        self.pending = PendingClears(state_dir)
        self._ensure = ensure
        self._changed = changed
        """Told (on the event loop) when a clear ends."""
        self.on_resumed_over: Callable[[], None] = lambda: None
        """Told when the last clear resumed at start is over (its devices offered again)."""
        self._tasks: dict[asyncio.Task[None], PendingClear] = {}
        self._asked: Counter[str] = Counter()
        self.resumed: dict[str, str] = {}
        """Device ID -> claim UID of the clears resumed at start and not over yet: no claim
        is prepared on these devices until they are (their previous tenant's function)."""
        self.stopping = False

    # -- what an unprepare does ------------------------------------------------------------

    @staticmethod
    def asked(uid: str, outcomes: Iterable[Outcome]) -> list[PendingClear]:
        """The clears the unprepare of claim ``uid`` (its devices' ``outcomes``) asks for."""
        return [PendingClear(o.device_id, uid, o.spec.clear) for o in outcomes
                if o.spec.clear is not None]

    def record(self, clears: list[PendingClear]) -> None:
        """Written before the claims leave the checkpoint; OSError when it cannot be."""
        self.pending.add(clears)

    def forget(self, clears: Iterable[PendingClear]) -> None:
        """The claims could not leave the checkpoint: their clears are not due."""
        for clear in clears:
            self.pending.remove(clear)

    def start(self, clears: Iterable[PendingClear], holders: Holders) -> None:
        """Run ``clears`` after the kubelet's answer; while stopping, leave them pending."""
        for clear in clears:
            if self.stopping:
                log.info("clearing %s after claim %s is left to the next instance of the "
                         "driver: this one is stopping", clear.device_id, clear.claim)
                continue
            self._run(clear, holders)

    def resume(self, held: Mapping[str, str], holders: Holders) -> None:
        """At take-over: every pending clear runs, except where a recorded claim still holds
        its device (``held``: device ID -> that claim), which keeps it pending."""
        for device_id, clear in self.pending.read().items():
            holder = held.get(device_id)
            if holder is not None:
                log.info("clearing %s after claim %s stays pending: claim %s holds it",
                         device_id, clear.claim, holder)
                continue
            log.warning("clearing %s after claim %s was cut off (the driver stopped or was "
                        "killed): running it before the device is offered again", device_id,
                        clear.claim)
            self.resumed[device_id] = clear.claim
            self._run(clear, holders)

    # -- running ---------------------------------------------------------------------------

    def changing(self) -> set[str]:
        """Devices a clear was asked for and is not over yet."""
        return set(self._asked)

    def _run(self, clear: PendingClear, holders: Holders) -> None:
        task = asyncio.get_running_loop().create_task(
            self._clear(clear, holders), name=f"clear {clear.device_id}")
        self._tasks[task] = clear
        self._asked[clear.device_id] += 1
        task.add_done_callback(partial(self._over, clear))

    async def _clear(self, clear: PendingClear, holders: Holders) -> None:
        what = f"clearing after claim {clear.claim}"
        try:
            outcome = await self._ensure(what, f"clear:{clear.claim}", clear.device_id,
                                         clear.function, holders)
        except ProgrammingRefused as refusal:  # a failed load quarantined the device
            log.warning("%s: %s", what, refusal)
        except Exception:  # a bug: what the device holds is not known, the clear stays due
            log.exception("%s: device %s: failed", what, clear.device_id)
            return
        else:
            log.info("%s: device %s: %s", what, clear.device_id, outcome.message())
        self.pending.remove(clear)  # known; a clear cut off (CancelledError) stays pending

    def _over(self, clear: PendingClear, task: asyncio.Task[None]) -> None:
        del self._tasks[task]
        self._asked[clear.device_id] -= 1
        if self._asked[clear.device_id] <= 0:
            del self._asked[clear.device_id]
        if self.resumed.get(clear.device_id) == clear.claim:
            del self.resumed[clear.device_id]
            if not self.resumed:
                self.on_resumed_over()
        self._changed()

    def running(self) -> list[asyncio.Task[None]]:
        return list(self._tasks)

    def stop(self) -> None:
        """From now on an unprepare's clears are left pending, for the next instance."""
        self.stopping = True
