"""Each prepared claim's devices in its ``status.devices[]`` (KEP-4817), kept as health changes.

What ``kubectl describe resourceclaim`` shows a user: which port the pod got (PCI address,
device nodes, CDI devices) and whether it is usable, with the reason the plugin knows when it is
not ("AFU ID is all f: firmware crashed"). The ``Ready`` condition is True once the device is
prepared and healthy, False with reason ``DeviceUnhealthy`` and the health reason as message
while it is unhealthy, Unknown (``HealthUnknown``) while its health cannot be read; it goes back
to True when the device recovers. ``lastTransitionTime`` moves only when the status does.

A claim holding one share of a device (KEP-5075) has its own entry, keyed by the share's
``shareID`` as the API server requires (an entry must name an allocation result, shareID
included); its data says how many ``contexts`` the share holds. Health is the device's, so
an unhealthy device fails every share's entry alike, each in its own claim.

The writes are off the prepare path: the kubelet's answer never waits on them, and a refused
(403: the cluster lacks the 1.36 ``resourceclaims/driver`` rule) or failed write never fails a
claim. Each claim has at most one write in flight; a failed one is tried again with back-off
(doubling from ``backoff_initial`` to ``backoff_max``, or the server's ``Retry-After``), each
kind of failure is logged once (a warning) until a write succeeds again, and every attempt is
counted (``dra_claim_status_writes_total{driver,result}``). A claim the server no longer has, or
has under another UID, is given up. Unprepare writes nothing: the API server drops the entries
of devices that are deallocated (k/k ``pkg/registry/resource/resourceclaim/strategy.go``,
``dropDeallocatedStatusDevices``), which is what becomes of a claim after its last pod; the
driver only stops following it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from plugin.process import metrics
from plugin.process.supervise import cancel_all
from plugin.serving.dra.apiserver import (
    ApiFailure,
    ApiRefused,
    Conflict,
    NotFound,
    retry_pause,
    translate,
)
from plugin.serving.dra.function_audit import CONDITION_REASONS
from plugin.serving.dra.health import health_of
from plugin.serving.dra.prepared import PreparedClaim, describe
from value_types.claims import ClaimRef, DeviceCondition, DeviceStatusReport, PreparedDevice
from value_types.devices import Device, DeviceSet
from value_types.health import HealthState

if TYPE_CHECKING:
    from plugin.programming.outcome import Outcome
    from plugin.serving.dra.function_audit import FunctionAudit

log = logging.getLogger(__name__)

READY = "Ready"
FUNCTION_LOADED = "FunctionLoaded"
BACKOFF_INITIAL = 0.5
BACKOFF_MAX = 30.0
CONCURRENT_WRITES = 4
"""Claims written at once: a node's claims are a handful, and after a health change of a
port shared by many claims this keeps the API server's load bounded."""

Write = Callable[[ClaimRef, tuple[DeviceStatusReport, ...]], Awaitable[Any]]
FunctionOf = Callable[[str, str], "Outcome | None"]
"""(claim UID, device ID) -> what was done to give the device its claim's function."""
NodeConditions = Callable[[], tuple[tuple[str, str, str, str], ...]]
"""Conditions that hold for every prepared device of the node now, as (type, status, reason,
message): e.g. ``RuntimeAppliesCDI`` False where the runtime may not apply CDI
(:mod:`plugin.serving.runtime_cdi`). Call :meth:`ClaimStatusReporter.devices_changed` when
they change."""


def rfc3339(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def device_data(prepared: PreparedDevice, device: Device | None) -> dict[str, Any]:
    """The entry's ``data``: where the port is, as a user debugging a pod asks it."""
    data: dict[str, Any] = {"deviceID": prepared.device_id}
    if device is not None:
        attrs = device.attrs
        for key, name in (("pci_address", "pciAddress"), ("port", "port"),
                          ("afu_id", "afuID"), ("interface_id", "interfaceID")):
            if attrs.get(key):
                data[name] = attrs[key]
        nodes = [n.host_path for n in device.nodes]
        if nodes:
            data["deviceNodes"] = nodes
    if prepared.cdi_ids:
        data["cdiDevices"] = list(prepared.cdi_ids)
    data["requests"] = list(prepared.requests)
    if prepared.contexts is not None:
        data["contexts"] = prepared.contexts
    return data


def entry_key(device: PreparedDevice) -> str:
    """Which entry of a claim's status a device's transitions belong to: a claim may hold
    two shares of one device, each its own entry."""
    return device.device if device.share_id is None else f"{device.device}@{device.share_id}"


def _frozen(data: Mapping[str, Any]) -> tuple[tuple[str, object], ...]:
    return tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in data.items())


def ready_of(device: Device | None) -> tuple[str, str, str]:
    """(status, reason, message) of the ``Ready`` condition for a prepared device."""
    state, message = health_of(device)
    if state is HealthState.HEALTHY:
        return "True", "Prepared", "prepared for the claim's containers; the device is healthy"
    if state is HealthState.UNHEALTHY:
        return "False", "DeviceUnhealthy", message
    return "Unknown", "HealthUnknown", message


@dataclass
class _Claim:
    claim: PreparedClaim
    wanted: bool = False
    """A write is due (the claim is new, or the devices changed since the last one)."""
    written: tuple[DeviceStatusReport, ...] | None = None
    transitions: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Entry (:func:`entry_key`) -> (Ready status, since): when the status last changed."""
    task: asyncio.Task[None] | None = None
    refusal: tuple[FunctionAudit, ...] | None = None
    """Set for a claim refused for its function: written once, not followed."""


class ClaimStatusReporter:
    """Follows the prepared claims and keeps their ``status.devices`` entries true.

    ``devices()`` is the device set now; ``write(ref, reports)`` applies the claim's entries
    (raises what :mod:`.apiserver` raises). Call :meth:`prepared` with each claim the kubelet
    was answered for, :meth:`unprepared` when it is unprepared, :meth:`devices_changed` when
    discovery says something new.
    """

    def __init__(self, driver: str, devices: Callable[[], DeviceSet], write: Write, *,
                 backoff_initial: float = BACKOFF_INITIAL, backoff_max: float = BACKOFF_MAX,
                 clock: Callable[[], float] = time.time,
                 function_of: FunctionOf = lambda uid, device_id: None,
                 node_conditions: NodeConditions = tuple) -> None:
        self.driver = driver
        self._node_conditions = node_conditions
        self._function_of = function_of
        self._devices = devices
        self._write = write
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._clock = clock
        self._claims: dict[str, _Claim] = {}
        self._said: set[tuple[type, int | None]] = set()
        self._slots = asyncio.Semaphore(CONCURRENT_WRITES)
        self._closed = False

    # -- what the driver tells ---------------------------------------------------------------

    def prepared(self, claims: Iterable[PreparedClaim]) -> None:
        """Claims the kubelet was just answered for (new or prepared before): write each
        one's entries unless the same were written already."""
        for claim in claims:
            if not claim.devices:
                continue
            known = self._claims.get(claim.ref.uid)
            if known is None or known.refusal is not None:
                known = self._claims[claim.ref.uid] = _Claim(claim)
            known.claim = claim
            self._want(known)

    def refused(self, ref: ClaimRef, audits: Iterable[FunctionAudit]) -> None:
        """A claim refused for the function its configuration names: each device's entry
        says why (``kubectl describe resourceclaim``), written once and then left; the
        kubelet's next call prepares it, or the claim is deallocated and the API server
        drops the entries."""
        records = tuple(audits)
        if not records or (ref.uid in self._claims and self._claims[ref.uid].refusal is None):
            return
        devices = tuple(PreparedDevice(*a.device.split("/", 1), a.device_id, (), (),
                                       a.share_id) for a in records)
        previous = self._claims.get(ref.uid)
        known = self._claims[ref.uid] = _Claim(PreparedClaim(ref, devices), refusal=records)
        if previous is not None and previous.task is not None:
            previous.task.cancel()
        self._want(known)

    def follow(self, claims: Iterable[PreparedClaim]) -> None:
        """Claims prepared before this process started (from its checkpoint): written once
        now, since their devices' health may have changed while no process watched it (the
        ``lastTransitionTime`` then says when this process first saw the status), then as
        for any other claim."""
        self.prepared(c for c in claims if c.ref.uid not in self._claims)

    def unprepared(self, uids: Iterable[str]) -> None:
        for uid in uids:
            known = self._claims.pop(uid, None)
            if known is not None and known.task is not None:
                known.task.cancel()

    def devices_changed(self) -> None:
        for known in self._claims.values():
            if self._reports(known, peek=True) != known.written:
                self._want(known)

    async def close(self) -> None:
        self._closed = True
        await cancel_all(c.task for c in self._claims.values())

    @property
    def pending(self) -> int:
        """Claims whose entries are not written as they should be now."""
        return sum(1 for c in self._claims.values() if c.wanted or c.task is not None)

    # -- writing -----------------------------------------------------------------------------

    def _want(self, known: _Claim) -> None:
        known.wanted = True
        if self._closed or (known.task is not None and not known.task.done()):
            return
        known.task = asyncio.get_running_loop().create_task(
            self._sync(known), name=f"status of claim {describe(known.claim.ref)}")

    async def _sync(self, known: _Claim) -> None:
        delay = self._backoff_initial
        try:
            while known.wanted and self._claims.get(known.claim.ref.uid) is known:
                known.wanted = False
                reports = self._reports(known)
                if reports == known.written:
                    continue
                pause = await self._attempt(known, reports)
                if pause is None:
                    delay = self._backoff_initial
                    continue
                if pause < 0:
                    return  # given up on this claim
                known.wanted = True
                await asyncio.sleep(retry_pause(delay, pause, self._backoff_max))
                delay = min(delay * 2, self._backoff_max)
        finally:
            known.task = None
            if known.refusal is not None and not known.wanted and \
                    self._claims.get(known.claim.ref.uid) is known:
                del self._claims[known.claim.ref.uid]  # said once; not followed

    async def _attempt(self, known: _Claim, reports: tuple[DeviceStatusReport, ...]
                       ) -> float | None:
        """None: written; -1: give the claim up; else the server's Retry-After (or 0)."""
        ref = known.claim.ref
        try:
            async with self._slots:
                await self._write(ref, reports)
        except asyncio.CancelledError:
            raise
        except ValueError as exc:  # this driver's own entries are not what the API accepts
            metrics.dra_claim_status_write(self.driver, "error")
            log.error("not writing the status of claim %s: %s", describe(ref), exc)
            return -1
        except Exception as exc:
            failure = translate(exc)
            return self._failed(ref, failure)
        known.written = reports
        metrics.dra_claim_status_write(self.driver, "ok")
        if self._said:
            self._said.clear()
            log.info("claim status written again (claim %s)", describe(ref))
        log.debug("status of claim %s written: %s", describe(ref), ", ".join(
            f"{r.device} {r.conditions[0].status}" for r in reports))
        return None

    def _failed(self, ref: ClaimRef, failure: ApiFailure) -> float:
        if isinstance(failure, NotFound) and not failure.unserved:
            metrics.dra_claim_status_write(self.driver, "error")
            log.debug("claim %s is gone; not writing its status", describe(ref))
            return -1
        if isinstance(failure, Conflict) or (isinstance(failure, ApiRefused)
                                             and failure.status == 422):
            metrics.dra_claim_status_write(self.driver, "error")
            log.info("claim %s changed under the driver (deleted and made again?); not "
                     "writing its status: %s", describe(ref), failure)
            return -1
        refused = isinstance(failure, ApiRefused)
        metrics.dra_claim_status_write(self.driver, "refused" if refused else "error")
        kind = (type(failure), failure.status)
        if kind not in self._said:
            self._said.add(kind)
            hint = (" (the driver needs patch on resourceclaims/status and, from "
                    "Kubernetes 1.36, associated-node:patch on resourceclaims/driver for "
                    f"resourceNames [{self.driver}])" if failure.status == 403 else "")
            log.warning("cannot write the device status of claim %s%s: %s; prepared claims "
                        "are not affected, trying again with back-off", describe(ref), hint,
                        failure)
        return failure.retry_after or 0.0

    # -- what is written ---------------------------------------------------------------------

    def _reports(self, known: _Claim, peek: bool = False) -> tuple[DeviceStatusReport, ...]:
        if known.refusal is not None:
            return refusal_reports(self.driver, known.refusal, rfc3339(self._clock()))
        devices = self._devices()
        now = rfc3339(self._clock())
        reports = []
        for prepared in known.claim.devices:
            device = devices.get(prepared.device_id)
            status, reason, message = ready_of(device)
            entry = entry_key(prepared)
            previous = known.transitions.get(entry)
            since = previous[1] if previous is not None and previous[0] == status else now
            if not peek:
                known.transitions[entry] = (status, since)
            conditions = [DeviceCondition(READY, status, reason, message, since)]
            data = device_data(prepared, device)
            outcome = self._function_of(known.claim.ref.uid, prepared.device_id)
            if outcome is not None:
                data.update(function_data(outcome))
                key = f"{entry}/{FUNCTION_LOADED}"
                since = known.transitions.get(key, ("True", now))[1]
                if not peek:
                    known.transitions[key] = ("True", since)
                conditions.append(DeviceCondition(
                    FUNCTION_LOADED, "True",
                    "Loaded" if outcome.result == "loaded" else "AlreadyLoaded",
                    outcome.message(), since))
            for kind, status, reason, message in self._node_conditions():
                key = f"{entry}/{kind}"
                previous = known.transitions.get(key)
                since = previous[1] if previous is not None and previous[0] == status else now
                if not peek:
                    known.transitions[key] = (status, since)
                conditions.append(DeviceCondition(kind, status, reason, message, since))
            reports.append(DeviceStatusReport(
                self.driver, prepared.pool, prepared.device, _frozen(data),
                tuple(conditions), prepared.share_id))
        return tuple(reports)


def function_data(outcome: Outcome) -> dict[str, Any]:
    """The function the claim's configuration named, in ``data``: which, from which image,
    and whether it was loaded for this claim (by which loader, in how long) or held already."""
    data: dict[str, Any] = {"function": f"{outcome.spec.field} {outcome.spec.function_id}"}
    if outcome.spec.image:
        data["functionImage"] = outcome.spec.image
    digest = outcome.sha256 or outcome.spec.sha256
    if digest:
        data["functionImageSHA256"] = digest
    data["functionLoaded"] = outcome.message()
    return data


def refusal_reports(driver: str, audits: tuple[FunctionAudit, ...], now: str
                    ) -> tuple[DeviceStatusReport, ...]:
    """The entries of a claim refused for its function: not prepared, and why."""
    reports = []
    for audit in audits:
        pool, device = audit.device.split("/", 1)
        data: dict[str, Any] = {"deviceID": audit.device_id, "function": audit.function,
                                "functionOutcome": audit.outcome,
                                "functionRefused": audit.detail[:2048]}
        if audit.image:
            data["functionImage"] = audit.image
        if audit.sha256:
            data["functionImageSHA256"] = audit.sha256
        if audit.device_class:
            data["deviceClass"] = audit.device_class
        conditions = (
            DeviceCondition(READY, "False", "NotPrepared", "the claim was refused for the "
                            "function its configuration names; nothing was loaded", now),
            DeviceCondition(FUNCTION_LOADED, "False",
                            CONDITION_REASONS.get(audit.outcome, "Refused"),
                            audit.detail[:4096], now))
        reports.append(DeviceStatusReport(driver, pool, device, _frozen(data), conditions,
                                          audit.share_id))
    return tuple(reports)
