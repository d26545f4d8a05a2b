"""Loading a claim's function while the scheduler waits to bind its pod (``--program-at bind``).

The devices this driver publishes programmable carry the binding condition
``<driver>/FunctionReady`` and the failure condition ``<driver>/FunctionFailed``
(:mod:`.binding_conditions`). The 1.36 scheduler allocates such a device, writes the
allocation and the pod's reservation (``bindClaim``), then polls every 5 s, up to its
``bindingTimeout``, until every binding condition is True in the claim's ``status.devices[]``
entry for the device, and gives the allocation up (and the pod goes back to scheduling) as
soon as a failure condition is True (k/k ``pkg/scheduler/framework/plugins/dynamicresources/
dynamicresources.go``: ``PreBind``, ``isPodReadyForBinding``, ``isClaimReadyForBinding``,
``isClaimTimeout``, then ``Filter`` and ``PostFilter`` deallocate).

For each claim :mod:`.binding_watch` shows, allocated on this node's pool with that
condition and answered neither way yet, :class:`BindingLoader`:

* holds the claim's whole devices for it (``Programmer.claim_started``) from the moment it is
  seen until it is deallocated or deleted: no other claim's load (nor a clear) changes such a
  device between the load and the pod's prepare, which then finds the function held (the
  fast path) and needs nothing else;
* gives the claim its functions by the rules prepare follows, with the same
  :class:`~.prepare_functions.FunctionStep` and :class:`~plugin.programming.programmer.
  Programmer` (the class catalogue, ``allowedClaimFunctions``, pinning, the loader, one load
  at a time per card, quarantine of a card a failed load may have touched, the Events);
* sets ``FunctionReady`` True on each of its devices with what was done as the message, or
  ``FunctionFailed`` True naming the cause; a claim naming no function is ready at once; a
  share is ready only when its device holds the share's function (a share never programs);
* abandons a claim deallocated or deleted while its load runs: the load is never cut off
  half-way, but nothing is written for it, its devices are released, and a function loaded
  for it is cleared as an unprepare would (the class's ``clearOnUnprepare``), so no later
  claim is told it was loaded for it.

The conditions are written by server-side apply under their own field manager
(``<driver>/binding``), so the prepared claim's entries (:mod:`.claim_status`, the driver's
own manager) and these conditions never remove each other. A claim the checkpoint records is
prepared already: nothing is done for it (its pod is bound).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from api_versions.claim_binding import binding_states
from api_versions.resource_claims import claim_ref, parse_claim
from plugin.process import metrics
from plugin.process.supervise import cancel_all
from plugin.programming.outcome import LOADED, Outcome
from plugin.programming.programmer import Programmer
from plugin.serving.dra.apiserver import ApiRefused, Conflict, NotFound, retry_pause, translate
from plugin.serving.dra.binding_conditions import failed_condition, ready_condition
from plugin.serving.dra.checkpoint import ClaimCheckpoint
from plugin.serving.dra.claim_status import rfc3339
from plugin.serving.dra.prepare_functions import FunctionStep, Refused
from plugin.serving.dra.prepared import describe
from value_types.binding import BindingState
from value_types.claims import (
    AllocationResult,
    ClaimRef,
    DeviceCondition,
    DeviceStatusReport,
    PreparedDevice,
)

log = logging.getLogger(__name__)

Write = Callable[[ClaimRef, tuple[DeviceStatusReport, ...]], Awaitable[Any]]
Devices = Callable[[ClaimRef, tuple[AllocationResult, ...]], tuple[PreparedDevice, ...]]
"""The claim's devices on this node, or :class:`Refused` (the preparer's own checks)."""
BACKOFF_INITIAL = 0.5
BACKOFF_MAX = 30.0
MAX_MESSAGE = 4096


@dataclass
class _Claim:
    ref: ClaimRef
    key: tuple[tuple[str, str, str | None], ...]
    """(pool, device, shareID) of each result waited on: another allocation is another claim."""
    held: list[str]
    task: asyncio.Task[None] | None = None
    owner: str | None = None
    """A claim seen before this one that holds one of its whole devices (then this one
    holds none, and is refused: a device has one owner)."""
    answered: bool = False
    said: set[object] = field(default_factory=set)


class BindingLoader:
    """Answers the scheduler's binding conditions for this node's claims (module docstring).

    ``devices(ref, results)`` maps results to this node's devices as prepare does;
    ``write(ref, reports)`` applies the claim's entries under the binding field manager."""

    def __init__(self, driver: str, pool_name: str, device_names: Callable[[], Mapping[str, str]],
                 devices: Devices, functions: FunctionStep, programmer: Programmer,
                 checkpoint: ClaimCheckpoint, write: Write, *,
                 backoff_initial: float = BACKOFF_INITIAL,
                 backoff_max: float = BACKOFF_MAX) -> None:
        self.driver = driver
        self.pool_name = pool_name
        self.ready = ready_condition(driver)
        self.failed = failed_condition(driver)
        self._device_names = device_names
        self._devices = devices
        self.functions = functions
        self.programmer = programmer
        self._checkpoint = checkpoint
        self._write = write
        self._backoff = (backoff_initial, backoff_max)
        self._claims: dict[str, _Claim] = {}

    # -- what the watch tells --------------------------------------------------------------

    def seen(self, version: str, obj: Mapping[str, Any]) -> None:
        """A claim as listed or watched now; never raises for the claim's sake."""
        try:
            ref = claim_ref(version, obj)
            states = binding_states(version, obj, self.driver)
        except ValueError as exc:
            log.debug("not a claim this driver can read: %s", exc)
            return
        mine = tuple(s for s in states if s.result.pool == self.pool_name
                     and self.ready in s.conditions)
        key = tuple((s.result.pool, s.result.device, s.result.share_id) for s in mine)
        known = self._claims.get(ref.uid)
        if known is not None and (known.key != key or not mine):
            self.gone(ref.uid)
            known = None
        if not mine:
            return
        if known is None:
            known = self._claims[ref.uid] = self._held_for(ref, key, mine)
        if known.task is not None or known.answered or ref.uid in self._checkpoint:
            return
        if all(s.settled for s in mine):
            known.answered = True
            return
        known.task = asyncio.get_running_loop().create_task(
            self._answer(known, version, obj, mine), name=f"binding of {describe(ref)}")

    def gone(self, uid: str) -> None:
        """The claim was deleted, deallocated or allocated otherwise: its devices are free,
        and a load under way for it is abandoned (:meth:`_answer` finds it gone)."""
        known = self._claims.pop(uid, None)
        if known is not None and known.held:
            self.programmer.claim_finished(uid, known.held)

    def listed(self, uids: set[str]) -> None:
        """A full list: the claims followed that are not in it are gone."""
        for uid in [u for u in self._claims if u not in uids]:
            self.gone(uid)

    async def close(self) -> None:
        await cancel_all(c.task for c in self._claims.values())
        for uid in list(self._claims):
            self.gone(uid)

    # -- the work --------------------------------------------------------------------------

    def _held_for(self, ref: ClaimRef, key: tuple[tuple[str, str, str | None], ...],
                  mine: tuple[BindingState, ...]) -> _Claim:
        """The claim followed, its whole devices held for it (a share never loads anything),
        unless a claim seen before holds one of them: the first claim seen keeps a device."""
        names = self._device_names()
        whole = [names[s.result.device] for s in mine
                 if s.result.share_id is None and s.result.device in names]
        owner = next((other for other in self._claims.values()
                      if set(other.held) & set(whole)), None)
        if owner is not None:
            return _Claim(ref, key, [], owner=describe(owner.ref))
        if whole:
            self.programmer.claim_started(ref.uid, whole)
        return _Claim(ref, key, whole)

    async def _answer(self, known: _Claim, version: str, obj: Mapping[str, Any],
                      mine: tuple[BindingState, ...]) -> None:
        ref = known.ref
        outcomes: tuple[Outcome, ...] = ()
        failure: str | None = None
        try:
            self._sole_owner(known)
            allocation = parse_claim(version, obj, self.driver)
            devices = self._devices(ref, allocation.results_for(self.driver))
            outcomes = await self.functions.program(ref, allocation, devices)
        except Refused as refusal:
            failure = str(refusal)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug: the scheduler must hear, not wait 10 minutes
            log.exception("claim %s: cannot give its functions before binding", describe(ref))
            failure = f"the driver failed: {type(exc).__name__}: {exc}"
        if self._claims.get(ref.uid) is not known:
            self._abandoned(ref, outcomes)
            return
        if failure is None:
            log.info("claim %s: functions ready before binding", describe(ref))
        reports = self._reports(mine, outcomes, failure)
        metrics.dra_binding(self.driver, "ready" if failure is None else "failed")
        try:
            await self._written(known, reports)
        finally:
            known.task = None

    @staticmethod
    def _sole_owner(known: _Claim) -> None:
        """:class:`Refused` when a claim seen before this one holds one of its whole devices:
        a device has one owner, and the first claim seen keeps it (whichever of the two is
        answered first), so two claims allocated one device are never both ready."""
        if known.owner is not None:
            raise Refused(f"claim {describe(known.ref)}: a device of it is allocated to claim "
                          f"{known.owner} too; a device has one owner, so this claim must be "
                          "allocated again")

    def _abandoned(self, ref: ClaimRef, outcomes: tuple[Outcome, ...]) -> None:
        metrics.dra_binding(self.driver, "abandoned")
        loaded = [o for o in outcomes if o.result == LOADED]
        log.info("claim %s was deallocated or deleted while its functions were given; "
                 "nothing is written for it%s", describe(ref),
                 "; what was loaded for it is cleared as at unprepare"
                 if any(o.spec.clear for o in loaded) else "")
        try:
            self.programmer.unprepared(ref.uid, loaded,
                                       lambda d: self._checkpoint.holders(d, but=ref.uid))
        except OSError as exc:
            log.error("claim %s: the clear of its devices cannot be recorded: %s",
                      describe(ref), exc)

    def _reports(self, mine: tuple[BindingState, ...], outcomes: tuple[Outcome, ...],
                 failure: str | None) -> tuple[DeviceStatusReport, ...]:
        now = rfc3339(time.time())
        names = self._device_names()
        by_device = {o.device_id: o for o in outcomes}
        reports = []
        for state in mine:
            result = state.result
            if failure is not None:
                condition = DeviceCondition(self.failed, "True", "FunctionNotGiven",
                                            failure[:MAX_MESSAGE], now)
            else:
                outcome = by_device.get(names.get(result.device, ""))
                if outcome is None:
                    reason, message = "NoFunctionNeeded", "the claim needs no function loaded"
                elif outcome.result == LOADED:
                    reason, message = "Loaded", outcome.message()
                else:
                    reason, message = "AlreadyLoaded", outcome.message()
                condition = DeviceCondition(self.ready, "True", reason, message, now)
            reports.append(DeviceStatusReport(self.driver, result.pool, result.device, (),
                                              (condition,), result.share_id))
        return tuple(reports)

    async def _written(self, known: _Claim, reports: tuple[DeviceStatusReport, ...]) -> None:
        """Apply until written, or the claim is gone (deleted, deallocated, replaced)."""
        delay = self._backoff[0]
        while self._claims.get(known.ref.uid) is known:
            try:
                await self._write(known.ref, reports)
            except asyncio.CancelledError:
                raise
            except ValueError as exc:  # this driver's own entries are not what the API takes
                log.error("claim %s: binding conditions not written: %s",
                          describe(known.ref), exc)
                return
            except Exception as exc:
                failure = translate(exc)
                if isinstance(failure, (NotFound, Conflict)) or (
                        isinstance(failure, ApiRefused) and failure.status == 422):
                    log.info("claim %s changed or is gone; its binding conditions are not "
                             "written: %s", describe(known.ref), failure)
                    return
                kind = (type(failure), failure.status)
                if kind not in known.said:
                    known.said.add(kind)
                    log.warning("cannot write the binding conditions of claim %s: %s; the "
                                "scheduler waits meanwhile, trying again with back-off%s",
                                describe(known.ref), failure,
                                " (the driver needs patch on resourceclaims/status)"
                                if failure.status == 403 else "")
                await asyncio.sleep(retry_pause(delay, failure.retry_after, self._backoff[1]))
                delay = min(delay * 2, self._backoff[1])
                continue
            known.answered = True
            return
