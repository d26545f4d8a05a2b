"""The claim preparer's side of clears: the one place that orders them against the checkpoint.

:mod:`plugin.programming.clears` runs clears; this decides when, from the claims the
checkpoint records:

* an unprepare's clears are those of the last holder of each device (its last share): a
  device another recorded claim holds is not cleared, nor one a claim of the same call
  clears already. They are recorded pending before the claims leave the checkpoint (a
  record that cannot be written keeps every claim of the call prepared, with an error: the
  kubelet calls again), started once they left it, and dropped if they could not leave it;
* the first time this instance can read the checkpoint through the socket it holds (the
  kubelet's first call, or publishing, whichever comes first: nothing is awaited between the
  read and the resumption, so no claim is prepared in between), the clears the instance
  before left pending are resumed, except on devices a recorded claim still holds;
* until each resumed clear is over, a claim allocated its device is refused (the kubelet
  calls again), and the device is published draining (:meth:`ClaimClears.draining`).

While the checkpoint cannot be read, nothing is resumed: which claims hold which device is
not known.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence

from plugin.model.allocation import name_some
from plugin.programming.clears import Clears
from plugin.programming.pending_clears import PendingClear
from plugin.programming.programmer import Programmer
from plugin.serving.dra.checkpoint import ClaimCheckpoint
from plugin.serving.dra.prepared import PreparedClaim, describe
from value_types.claims import ClaimRef

log = logging.getLogger(__name__)


class ClaimClears:
    """Clears of the claims ``checkpoint`` records, run by ``programmer`` (None: none)."""

    def __init__(self, checkpoint: ClaimCheckpoint, programmer: Programmer | None) -> None:
        self.checkpoint = checkpoint
        self.programmer = programmer
        self.taken_over = False

    def asked_by(self, known: Mapping[str, PreparedClaim]) -> list[PendingClear]:
        """The clears unpreparing ``known`` (UID -> recorded claim) together asks for: none
        when nothing is known (the checkpoint cannot be read, and is not read here)."""
        if self.programmer is None or not known:
            return []
        others = [c for c in self.checkpoint.claims.values() if c.ref.uid not in known]
        clears: dict[str, PendingClear] = {}
        for uid, claim in known.items():
            for clear in Clears.asked(uid, claim.functions):
                if clear.device_id not in clears and not any(
                        d.device_id == clear.device_id for c in others for d in c.devices):
                    clears[clear.device_id] = clear
        return list(clears.values())

    def record(self, clears: list[PendingClear]) -> str:
        """Write ``clears`` pending; why they could not be ("": written)."""
        if not clears or self.programmer is None:
            return ""
        try:
            self.programmer.clears.record(clears)
        except OSError as exc:
            return (f"the clear of its device cannot be recorded ({exc.strerror or exc}), so "
                    "it stays prepared; the kubelet will call again")
        return ""

    def unprepared(self, clears: list[PendingClear], results: Mapping[str, str]) -> None:
        """The checkpoint changed (``results``: UID -> error): the clears of the claims that
        left it run, the others are dropped."""
        if not clears or self.programmer is None:
            return
        self.programmer.clears.forget(c for c in clears if results.get(c.claim))
        self.programmer.clears.start([c for c in clears if not results.get(c.claim)],
                                     self.checkpoint.holders)

    def take_over(self) -> None:
        """The checkpoint reads, through the socket this instance holds: resume what the
        instance before left pending (once)."""
        if self.taken_over or self.programmer is None:
            return
        self.taken_over = True
        held = {d.device_id: describe(claim.ref)
                for claim in self.checkpoint.claims.values() for d in claim.devices}
        self.programmer.clears.resume(held, self.checkpoint.holders)

    def refusal(self, ref: ClaimRef, device_ids: Iterable[str]) -> str | None:
        """Why claim ``ref`` cannot be prepared now: a device of it is being cleared after
        the claim that held it before this instance took over; None when none is."""
        if self.programmer is None:
            return None
        resumed = self.programmer.clears.resumed
        busy = [f"{d} (after claim {resumed[d]})" for d in device_ids if d in resumed]
        if not busy:
            return None
        return (f"claim {describe(ref)} is allocated devices still being cleared after the "
                f"claim that held them before the driver restarted: {name_some(busy)}; the "
                "kubelet will call again once they are cleared")

    def draining(self) -> frozenset[str]:
        """Devices published draining: their resumed clear is not over."""
        return frozenset(self.programmer.clears.resumed) if self.programmer else frozenset()


def stopping_error(refs: Sequence[ClaimRef]) -> dict[str, str]:
    """What every claim of a prepare is answered while the driver stops."""
    return {ref.uid: (f"claim {describe(ref)}: this instance of the DRA driver is stopping "
                      "(a rolling update or a restart) and takes no new claim; the kubelet "
                      "will call again, reaching the instance that takes over") for ref in refs}
