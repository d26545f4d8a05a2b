"""Preparing and unpreparing claims: what NodePrepareResources and NodeUnprepareResources do.

The kubelet sends only each claim's namespace, name and UID; the allocation is read from the
API server (``read_claim``), checked against this node's pool, recorded in the driver's
checkpoint, and only then answered. Every claim is answered on its own: one claim the API
server cannot give, or that names a device this node does not have, gets an error of its own
while the others are prepared, because the kubelet fails only that claim's pod and calls
again for it later. Rules (dra@v0.34.0 ``kubeletplugin/draplugin.go`` getResourceClaims, and
what a node-local driver must add):

* a claim already in the checkpoint is answered the same devices again, without an API call:
  the kubelet repeats a call it did not hear back from, and after its own restart;
* a claim that is not allocated, or whose UID is not the one asked for (deleted and created
  again under the same name), is refused;
* every result of this driver must name this node's pool and a device the pool has now;
  other drivers' results are theirs;
* a result that is one share of a device (KEP-5075 ``shareID``) meets the rules of
  :mod:`.shares`: a device published shared now, never two owners, never more contexts
  than the device has, never a load;
* unprepare works from the checkpoint alone (the claim may be gone from the API server) and
  is idempotent: an unknown UID was unprepared already; a class's ``clearOnUnprepare`` runs
  only once no other claim holds the device (the last share of it);
* while the checkpoint cannot be read (a newer release's major format after a rollback, a
  file that cannot be read), every claim of every call is refused, prepare and unprepare
  alike, with an error saying why: the driver cannot tell which claims it holds, so an
  unknown UID may well be prepared (its CDI spec in place), and answering it as done would
  let the kubelet forget it for good; a prepare would have to write over the record. The
  kubelet calls both again, and the record is read again at each call.

Overlapping calls for one claim share one preparation of it, which holds what it reserves
until the last of them ends; an unprepare and a prepare of one claim never overlap (each
waits for the other under way, an unprepare within its call's deadline): :mod:`.claim_flights`.

Claims of one call are handled concurrently, at most ``concurrency`` API reads at a time
across all calls. Nothing is written until every claim of the call is read and checked;
then their CDI specs, then one checkpoint change for all of them, so a call of 1,000 claims
costs one journal line, not 1,000, and a call cancelled while reading leaves nothing behind.
A call answers before its deadline (the kubelet's is 45 s): a claim still being read then
gets a timeout error instead of the whole call failing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from functools import partial

from plugin.model.allocation import name_some
from plugin.process import metrics
from plugin.programming.programmer import Programmer
from plugin.serving.dra.checkpoint import CheckpointError, ClaimCheckpoint
from plugin.serving.dra.claim_cdi import ClaimSpecs
from plugin.serving.dra.claim_clears import ClaimClears, stopping_error
from plugin.serving.dra.claim_flights import ClaimFlights, Hold, at
from plugin.serving.dra.claim_spec_files import groups as _groups
from plugin.serving.dra.claim_spec_files import remove_specs, share_groups, write_specs
from plugin.serving.dra.function_audit import Auditor
from plugin.serving.dra.prepare_functions import (
    DeviceClasses,
    FunctionStep,
    Refused,
    RefusedInStatus,
)
from plugin.serving.dra.prepared import PreparedClaim, describe
from plugin.serving.dra.shares import PublishedContexts, PublishedShares, ShareAdmission
from value_types.claims import (
    AllocationResult,
    ClaimAllocation,
    ClaimRef,
    ClaimResult,
    PreparedDevice,
    base_request,
)

log = logging.getLogger(__name__)

ReadClaim = Callable[[ClaimRef], Awaitable[ClaimAllocation]]
Observer = Callable[[list[PreparedClaim]], None]
"""Told the claims a call prepared (or found prepared), once the answer is on its way."""
Forget = Callable[[list[str]], None]
"""Told the UIDs a call unprepared."""
DEFAULT_CONCURRENCY = 32
DEFAULT_READ_TIMEOUT = 20.0
"""One claim read; a call's own deadline may cut it shorter."""


class ClaimNotFound(LookupError):
    """What ``read_claim`` raises when the API server has no such claim (HTTP 404).

    An exception with ``status == 404`` (and no true ``unserved``: a path the server does not
    serve is not a missing claim), like :mod:`plugin.serving.dra.apiserver`'s ``NotFound``,
    counts too; ``status`` 401 or 403 is a refusal (credentials, RBAC); anything else (a
    connection refused, a timeout, 429, 5xx...) is the API server being unavailable for now.
    Each is one claim's error either way; only the words differ."""


class ClaimPreparer:
    """Prepares and unprepares this driver's claims on this node.

    ``device_names()`` maps each DRA device name of this node's pool to the internal device
    ID, as published now; ``cdi_ids(device_id)`` gives the CDI IDs of the daemon's spec for a
    device (empty when it has nothing to inject); ``read_claim(ref)`` reads the claim from
    the API server. With ``claim_specs`` each claim also gets a CDI spec carrying its
    containers' environment. ``published_contexts()`` names the devices published shared
    now, with their contexts (device ID -> N; none: every device is published whole), and
    ``published_shares()`` what each is shared as (the function a share of it is for).
    """

    def __init__(self, driver: str, pool_name: str,
                 device_names: Callable[[], Mapping[str, str]], read_claim: ReadClaim,
                 cdi_ids: Callable[[str], list[str]], checkpoint: ClaimCheckpoint, *,
                 claim_specs: ClaimSpecs | None = None,
                 concurrency: int = DEFAULT_CONCURRENCY,
                 read_timeout: float = DEFAULT_READ_TIMEOUT,
                 on_prepared: Observer | None = None,
                 on_unprepared: Forget | None = None,
                 held: Callable[[], Mapping[str, str]] = dict,
                 programmer: Programmer | None = None, auditor: Auditor | None = None,
                 refused_in_status: RefusedInStatus | None = None,
                 published_contexts: PublishedContexts = dict,
                 published_shares: PublishedShares = dict,
                 device_classes: DeviceClasses | None = None) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency}")
        self.driver = driver
        self.pool_name = pool_name
        self.checkpoint = checkpoint
        self.claim_specs = claim_specs
        self.read_timeout = read_timeout
        self._device_names = device_names
        self._read_claim = read_claim
        self._cdi_ids = cdi_ids
        self._reads = asyncio.Semaphore(concurrency)
        self.on_prepared = on_prepared
        self.on_unprepared = on_unprepared
        self._held = held
        """Device ID -> who still holds it through the device plugin (after a move to DRA):
        such a device is prepared for no claim until released."""
        self.programmer = programmer
        """Gives devices the function their claim's configuration names (None: a claim
        that names one is refused)."""
        self.shares = ShareAdmission(published_contexts,
                                     lambda: self.checkpoint.claims.values(),
                                     lambda: self.checkpoint.sharing_claims(), published_shares)
        self.clears = ClaimClears(checkpoint, programmer)
        self.stopping = False
        """Set when the driver stops: every prepare is refused (the kubelet calls again,
        reaching the instance that takes over)."""
        self.functions = FunctionStep(driver, pool_name, programmer, self._holders, auditor,
                                      refused_in_status, self.shares.admitted_as,
                                      device_classes)
        self.flights = ClaimFlights(self._prepare_one, self._record, self._loading)
        """One preparation per claim however many calls ask for it, and no unprepare of
        a claim while it is being prepared (:mod:`.claim_flights`)."""

    # -- prepare ---------------------------------------------------------------------------

    async def prepare(self, claims: Sequence[ClaimRef],
                      timeout: float | None = None) -> dict[str, ClaimResult]:
        """Claim UID -> devices or error, for every claim asked (duplicates answered once).

        ``timeout``: seconds until the answer must go out; claims not prepared by then get
        an error saying so. Never raises for a claim's sake; cancelled, it leaves nothing
        behind but what was already recorded."""
        results = await self._prepare(claims, timeout) if not self.stopping else {
            uid: ClaimResult(error=error) for uid, error in stopping_error(claims).items()}
        failed = sum(1 for result in results.values() if not result.ok)
        metrics.dra_claims(self.driver, "prepare", len(results) - failed, failed)
        if self.on_prepared is not None:
            done = [claim for uid, result in results.items()
                    if result.ok and (claim := self.checkpoint.get(uid)) is not None]
            if done:  # after the answer: the kubelet does not wait on what comes of it
                asyncio.get_running_loop().call_soon(self.on_prepared, done)
        return results

    async def _prepare(self, claims: Sequence[ClaimRef],
                       timeout: float | None) -> dict[str, ClaimResult]:
        refusal = self._unavailable()
        if refusal is not None:
            return {ref.uid: ClaimResult(error=refusal) for ref in claims}
        deadline = at(timeout)
        results: dict[str, ClaimResult] = {}
        asked: dict[str, ClaimRef] = {}
        for ref in claims:
            if ref.uid in results or ref.uid in asked:
                continue
            if not ref.uid:
                results[ref.uid] = ClaimResult(error=f"claim {ref.namespace}/{ref.name} "
                                                     "has no UID in the request")
            else:
                asked[ref.uid] = ref
        # Nothing is looked up while an unprepare of the claim is under way; from here on,
        # no await until each claim is found recorded or its flight joined.
        busy = await self.flights.unprepared(asked.values(), deadline)
        results.update((uid, ClaimResult(error=error)) for uid, error in busy.items())
        known = [entry for uid in asked if uid not in busy
                 and (entry := self.checkpoint.get(uid)) is not None]
        flights = self.flights.join(ref for uid, ref in asked.items()
                                    if uid not in busy and uid not in self.checkpoint)
        try:
            if known:
                with self.flights.touching([entry.ref.uid for entry in known]):
                    for entry in known:
                        results[entry.ref.uid] = await self._again(entry)
            if flights:
                await self.flights.answer(flights, timeout, deadline, results)
        finally:
            self.flights.leave(flights)
        return results

    async def _again(self, known: PreparedClaim) -> ClaimResult:
        """A claim prepared before: the recorded devices, and its spec put back if a reboot
        (``/var/run/cdi`` is a tmpfs) took it."""
        specs = self.claim_specs
        if specs is not None and known.claim_spec is not None and \
                not (specs.directory / known.claim_spec).exists():
            try:
                await asyncio.to_thread(specs.write, known.ref.uid, _groups(known.devices),
                                        share_groups(known.devices))
            except OSError as exc:
                return ClaimResult(error=f"cannot write the CDI spec of claim "
                                         f"{describe(known.ref)} again: {exc.strerror or exc}")
        log.debug("claim %s prepared already", describe(known.ref))
        return ClaimResult(known.devices)

    async def _prepare_one(self, ref: ClaimRef, hold: Hold) -> PreparedClaim:
        """Read, let in and program one claim (a flight's work: :mod:`.claim_flights`);
        what it reserves is taken into ``hold``, given back when its flight ends."""
        allocation = await self._read(ref)
        if allocation.ref.uid != ref.uid:
            raise Refused(f"claim {ref.namespace}/{ref.name} was replaced: the API server has "
                          f"UID {allocation.ref.uid}, the kubelet asked for {ref.uid}")
        if not allocation.allocated:
            raise Refused(f"claim {describe(ref)} is not allocated")
        results = allocation.results_for(self.driver)
        devices = self._devices(ref, results)
        refusal = self.shares.admit(ref, devices)
        if refusal is not None:
            raise Refused(refusal)
        hold.take(partial(self.shares.release, ref.uid))
        if self.programmer is not None:
            # From here until the claim is recorded or refused, no load for anyone else
            # starts on its devices, whether or not it names a function.
            ids = [d.device_id for d in devices]
            self.programmer.claim_started(ref.uid, ids)
            hold.take(partial(self.programmer.claim_finished, ref.uid, ids))
        functions = await self.functions.program(ref, allocation, devices)
        spec = None
        if self.claim_specs is not None and devices:
            devices = self._with_env(ref.uid, devices)
            spec = self.claim_specs.file_name(ref.uid)  # written by _record
        return PreparedClaim(ref, devices, spec, functions)

    def _loading(self) -> Mapping[str, str]:
        """Claim UID -> the load it waits for now, for a call answered before it ends."""
        return self.programmer.waiting if self.programmer is not None else {}

    def _holders(self, uid: str, device_id: str) -> list[str]:
        """The other recorded claims holding ``device_id``."""
        return self.checkpoint.holders(device_id, but=uid)

    async def _read(self, ref: ClaimRef) -> ClaimAllocation:
        async with self._reads:
            try:
                async with asyncio.timeout(self.read_timeout):
                    return await self._read_claim(ref)
            except TimeoutError as exc:
                raise Refused(f"reading claim {describe(ref)} from the API server timed "
                              f"out after {self.read_timeout:g} s; the kubelet will call "
                              "again") from exc
            except ValueError as exc:  # read, but not a claim the driver can prepare
                raise Refused(f"claim {describe(ref)} cannot be prepared: {exc}") from exc
            except Exception as exc:
                raise Refused(_read_failure(ref, exc)) from exc

    def _devices(self, ref: ClaimRef,
                 results: Sequence[AllocationResult]) -> tuple[PreparedDevice, ...]:
        """The claim's devices on this node, or Refused naming every result that is not."""
        names = self._device_names()
        foreign = [f"{r.pool}/{r.device}" for r in results if r.pool != self.pool_name]
        unknown = [r.device for r in results
                   if r.pool == self.pool_name and r.device not in names]
        problems = []
        if foreign:
            problems.append(f"devices of other pools: {name_some(foreign)} (this node's pool "
                            f"is {self.pool_name})")
        if unknown:
            problems.append(f"devices pool {self.pool_name} does not have: {name_some(unknown)}")
        if problems:
            raise Refused(f"claim {describe(ref)} is allocated {'; '.join(problems)}")
        clearing = self.clears.refusal(ref, (names[r.device] for r in results))
        if clearing is not None:
            raise Refused(clearing)
        held = self._held()
        busy = [f"{r.device} ({held[names[r.device]]})" for r in results
                if names[r.device] in held]
        if busy:
            raise Refused(f"claim {describe(ref)} is allocated devices still in use through "
                          f"the device plugin: {name_some(busy)}; the kubelet will call again "
                          "once they are released")
        devices = []
        for result in results:
            device_id = names[result.device]
            try:
                cdi = tuple(self._cdi_ids(device_id))
            except Exception as exc:
                raise Refused(f"claim {describe(ref)}: no CDI IDs for device "
                              f"{result.pool}/{result.device} ({device_id}): {exc}") from exc
            share = result.share_id
            devices.append(PreparedDevice(result.pool, result.device, device_id,
                                          (result.request,), cdi, share,
                                          (result.consumed_contexts or 1) if share else None))
        return tuple(devices)

    def _with_env(self, uid: str, devices: tuple[PreparedDevice, ...]
                  ) -> tuple[PreparedDevice, ...]:
        """The first device of each request also names that request's environment device."""
        assert self.claim_specs is not None
        seen: set[str] = set()
        out = []
        for device in devices:
            request = base_request(device.requests[0])
            if request not in seen:
                seen.add(request)
                device = replace(device, cdi_ids=(*device.cdi_ids,
                                                  self.claim_specs.qualified(uid, request)))
            out.append(device)
        return tuple(out)

    async def _record(self, prepared: list[PreparedClaim],
                      results: dict[str, ClaimResult]) -> None:
        """Specs written, then the checkpoint, and only then the answer: a claim answered is
        a claim recorded, and a claim recorded has its spec."""
        written = await self._write_specs(prepared, results)
        if not written:
            return
        try:
            await self.checkpoint.commit(put=written)
        except CheckpointError as exc:
            log.error("%s; %d claim(s) not prepared", exc, len(written))
            await self._remove_specs([(c.ref.uid, c.claim_spec) for c in written])
            for claim in written:
                results[claim.ref.uid] = ClaimResult(
                    error=f"claim {describe(claim.ref)} could not be recorded: {exc}")
            return
        for claim in written:
            results[claim.ref.uid] = ClaimResult(claim.devices)
        # Logged once the answer is on its way: the kubelet waits on the answer, not the log.
        asyncio.get_running_loop().call_soon(_log_prepared, written)

    async def _write_specs(self, prepared: list[PreparedClaim],
                           results: dict[str, ClaimResult]) -> list[PreparedClaim]:
        return await write_specs(self.claim_specs, prepared, results)

    async def _remove_specs(self, claims: list[tuple[str, str | None]]) -> None:
        await remove_specs(self.claim_specs, claims)

    # -- unprepare -------------------------------------------------------------------------

    async def unprepare(self, claims: Sequence[ClaimRef],
                        timeout: float | None = None) -> dict[str, str]:
        """Claim UID -> error (``""``: done) for every claim asked; from the checkpoint only,
        once no prepare of the claim is under way (within ``timeout`` seconds; a claim
        still being prepared then is this call's error, see :mod:`.claim_flights`)."""
        async with self.flights.unpreparing(claims, timeout) as (free, busy):
            results = await self._unprepare_settled(free) if free else {}
        if busy:
            metrics.dra_claims(self.driver, "unprepare", 0, len(busy))
        return {ref.uid: busy.get(ref.uid, results.get(ref.uid, "")) for ref in claims}

    async def _unprepare_settled(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """:meth:`unprepare` of claims no prepare is under way for. Their clears are
        recorded pending before they leave the checkpoint (:mod:`.claim_clears`)."""
        known = {} if self.programmer is None or self._unavailable() is not None else {
            ref.uid: entry for ref in claims
            if (entry := self.checkpoint.get(ref.uid)) is not None}
        clears = self.clears.asked_by(known)
        results = await self._unprepare(claims, self.clears.record(clears))
        self.clears.unprepared(clears, results)
        failed = sum(1 for error in results.values() if error)
        metrics.dra_claims(self.driver, "unprepare", len(results) - failed, failed)
        if self.on_unprepared is not None:
            self.on_unprepared([uid for uid, error in results.items() if not error])
        return results

    async def _unprepare(self, claims: Sequence[ClaimRef], refused: str) -> dict[str, str]:
        refusal = self._unavailable()
        if refusal is not None:
            return {ref.uid: refusal for ref in claims}
        known = {ref.uid: entry for ref in claims
                 if (entry := self.checkpoint.get(ref.uid)) is not None}
        results = dict.fromkeys((ref.uid for ref in claims), "")
        if refused:  # no clear recorded: no claim leaves the checkpoint
            log.error("%d claim(s) stay prepared: %s", len(known), refused)
            return {**results, **{u: f"claim {describe(e.ref)}: {refused}"
                                  for u, e in known.items()}}
        try:
            await self.checkpoint.commit(remove=list(known))
        except CheckpointError as exc:
            log.error("%s; %d claim(s) stay prepared", exc, len(known))
            for uid, entry in known.items():
                results[uid] = f"claim {describe(entry.ref)} could not be unrecorded: {exc}"
            return results
        # After the checkpoint: a recorded claim never lacks its spec.
        await self._remove_specs([
            (ref.uid, entry.claim_spec if (entry := known.get(ref.uid)) else None)
            for ref in claims])
        for ref in claims:
            entry = known.get(ref.uid)
            if entry is not None:
                log.info("unprepared claim %s", describe(entry.ref))
            else:
                log.debug("claim %s was not prepared (or unprepared already)", describe(ref))
        return results

    def _unavailable(self) -> str | None:
        """What every claim is answered while the checkpoint cannot be read, or None."""
        reason = self.checkpoint.unavailable()
        if reason is None:
            self.clears.take_over()  # read through the socket: this instance's from now on
            return None
        return (f"the DRA driver's claim checkpoint {self.checkpoint.path} cannot be read "
                f"({reason}), so it cannot tell which claims it holds: no claim is prepared "
                "or unprepared until it can be read (the kubelet will call again)")


def _log_prepared(prepared: list[PreparedClaim]) -> None:
    for claim in prepared:
        log.info("prepared claim %s: %s", describe(claim.ref), ", ".join(
            f"{d.pool}/{d.device} ({d.device_id})" for d in claim.devices) or "no device")


def _read_failure(ref: ClaimRef, exc: Exception) -> str:
    """What the kubelet shows on the pod when the claim could not be read."""
    status = getattr(exc, "status", None)
    if isinstance(exc, ClaimNotFound) or (status == 404 and not getattr(exc, "unserved", False)):
        return f"claim {describe(ref)} not found in the API server (deleted?): {exc}"
    if status in (401, 403):
        return (f"the API server refused to give claim {describe(ref)} (the driver needs "
                f"get on resourceclaims): {exc}")
    return (f"cannot read claim {describe(ref)} from the API server (unavailable; the "
            f"kubelet will call again): {type(exc).__name__}: {exc}")
