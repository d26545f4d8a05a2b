"""The programming step of a prepare: each device given the function its request names.

Between reading a claim and recording it, :class:`~.prepare.ClaimPreparer` hands the claim
here. Its configurations are parsed (:mod:`plugin.programming.function_config`), a claim's
own function is held against its DeviceClass's catalogue, and every device whose request
names a function is checked, then loaded or left as it is, by the
:class:`~plugin.programming.programmer.Programmer`. Whatever comes of each device is audited
(:mod:`.function_audit`); a refusal is that claim's error, and is also written into the
claim's status, so ``kubectl describe resourceclaim`` says why without the pod's events.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from api_versions.device_classes import driver_configs
from plugin.process import metrics
from plugin.programming.function_config import (
    NO_FUNCTIONS,
    ClaimFunctions,
    FunctionRefused,
    FunctionSpec,
    function_shown,
    functions_of,
    needs_class_configs,
)
from plugin.programming.outcome import LOADED as OUTCOME_LOADED
from plugin.programming.outcome import SKIPPED as OUTCOME_SKIPPED
from plugin.programming.outcome import Outcome
from plugin.programming.programmer import Programmer, ProgrammingRefused
from plugin.serving.dra import function_audit as audit
from plugin.serving.dra.apiserver import ApiFailure
from plugin.serving.dra.function_grants import FunctionGrants
from plugin.serving.dra.prepared import describe
from plugin.serving.dra.shares import SharedAs, function_not_held, not_shared_function, where
from value_types.claims import ClaimAllocation, ClaimRef, PreparedDevice

NOT_ALLOWED = "not_allowed"
"""``dra_programming_total`` result of a claim's function its class does not allow."""
NOT_HELD = "not_held"
"""``dra_programming_total`` result of a share whose function its device does not hold."""
NOT_GRANTED = "not_granted"
"""``dra_programming_total`` result of a guarded function for a namespace not granted it."""


class Refused(Exception):
    """One claim cannot be prepared; the message is what the kubelet shows on the pod."""


Holders = Callable[[str, str], list[str]]
"""(claim UID, device ID) -> the other recorded claims that hold the device."""
RefusedInStatus = Callable[[ClaimRef, Sequence[audit.FunctionAudit]], None]
AdmittedAs = Callable[[str], Mapping[str, SharedAs]]
"""Claim UID -> what each device it holds a share of was shared as when it was let in."""
DeviceClasses = Callable[[], Awaitable[list[dict[str, Any]]]]
"""Every DeviceClass as the API server has it now: listed only for a claim whose class
configurations name no request (an old scheduler's) while its requests are of several
classes, to tell which requests each is for."""


class FunctionStep:
    """Gives a claim's devices their functions, and says what came of each."""

    def __init__(self, driver: str, node: str, programmer: Programmer | None,
                 holders: Holders, auditor: audit.Auditor | None = None,
                 refused_in_status: RefusedInStatus | None = None,
                 admitted_as: AdmittedAs = lambda _uid: {},
                 device_classes: DeviceClasses | None = None,
                 grants: FunctionGrants | None = None) -> None:
        self.driver = driver
        self.grants = grants
        """``--function-grants``: who may have a device holding a guarded function."""
        self._device_classes = device_classes
        self._admitted_as = admitted_as
        self.node = node
        self.programmer = programmer
        self.auditor = auditor or audit.Auditor()
        self.refused_in_status = refused_in_status
        self._holders = holders

    async def program(self, ref: ClaimRef, allocation: ClaimAllocation,
                      devices: tuple[PreparedDevice, ...]) -> tuple[Outcome, ...]:
        """What was done for each device that needed a function (recorded with the claim);
        :class:`Refused` when any could not be given its function: nothing is loaded for a
        claim refused before its loads, whatever its other devices."""
        functions = await self._functions(ref, allocation, devices)
        wanted: list[tuple[PreparedDevice, FunctionSpec]] = []
        refusals: list[audit.FunctionAudit] = []
        first: FunctionRefused | None = None
        for device in devices:
            try:
                spec = functions.function_for(device.requests[0])
            except FunctionRefused as refusal:
                first = first or refusal
                metrics.dra_programming(self.driver, refusal.spec.family, "", NOT_ALLOWED,
                                        0.0)
                refusals.append(self._audit(audit.NOT_ALLOWED, ref, allocation, device,
                                            refusal.spec, None, str(refusal), functions))
                continue
            if spec is not None:
                wanted.append((device, spec))
        if first is not None:
            self._refused(ref, refusals)
            raise Refused(f"claim {describe(ref)}: {first}")
        if self.grants is not None:  # before anything is loaded, whatever the class
            await self._granted(ref, allocation, devices, wanted)
        programmer = self.programmer
        if programmer is None:
            if wanted:
                why = "this driver does not program devices"
                self._refused(ref, [self._audit(audit.REFUSED, ref, allocation, d, s, None,
                                                why, functions) for d, s in wanted])
                raise Refused(f"claim {describe(ref)} names a function to load, and {why}")
            return ()
        specs = dict(wanted)
        shared = [(d, specs.get(d)) for d in devices if d.share_id is not None]
        wanted = [(d, s) for d, s in wanted if d.share_id is None]
        try:
            # No answer while a load (a clear, another claim's) is changing a device.
            await programmer.settled(d.device_id for d in devices)
            outcomes = await self._held_by_shares(ref, allocation, shared, functions)
            if len(wanted) > 1:  # every device checked before any is loaded
                for device, spec in wanted:
                    await programmer.check(device.device_id, spec)
            for device, spec in wanted:
                outcome = await programmer.ensure(
                    describe(ref), ref.uid, device.device_id, spec,
                    lambda device_id: self._holders(ref.uid, device_id))
                outcomes.append(outcome)
                if outcome.result == OUTCOME_LOADED:
                    self.auditor.record(self._audit(audit.LOADED, ref, allocation, device,
                                                    spec, outcome.sha256, outcome.message(),
                                                    functions))
                elif self.auditor.skips_recorded():  # nothing loaded: debug only
                    self.auditor.record(self._audit(audit.SKIPPED, ref, allocation, device,
                                                    spec, None, outcome.message(), functions))
            return tuple(outcomes)
        except ProgrammingRefused as refusal:
            failed = [(d, s) for d, s in wanted if d.device_id == refusal.device_id] or \
                wanted[:1]
            self._refused(ref, [self._audit(refusal.result, ref, allocation, d, s,
                                            refusal.sha256, str(refusal), functions)
                                for d, s in failed])
            raise Refused(f"claim {describe(ref)}: {refusal}") from None

    async def _granted(self, ref: ClaimRef, allocation: ClaimAllocation,
                       devices: tuple[PreparedDevice, ...],
                       wanted: list[tuple[PreparedDevice, FunctionSpec]]) -> None:
        """:class:`Refused` when a device holds, or would be loaded with, a guarded function
        the claim's namespace is not granted (:mod:`.function_grants`)."""
        assert self.grants is not None
        specs = dict(wanted)
        refused = await self.grants.refusals(
            ref, devices, {d.device_id: (s.family, s.function_id) for d, s in wanted})
        if not refused:
            return
        classes = ClaimFunctions((), allocation.classes)
        records = []
        for device, (family, function_id), why in refused:
            metrics.dra_programming(self.driver, family, "", NOT_GRANTED, 0.0)
            spec = specs.get(device)
            records.append(audit.FunctionAudit(
                outcome=audit.NOT_GRANTED, namespace=ref.namespace, claim=ref.name,
                uid=ref.uid, pods=allocation.reserved_for,
                device_class=classes.class_of(device.requests[0]),
                function=function_shown(family, function_id, "unreadable"),
                image=spec.image if spec is not None else None, sha256=None, node=self.node,
                device=f"{device.pool}/{device.device}", device_id=device.device_id,
                detail=why, share_id=device.share_id))
        self._refused(ref, records)
        raise Refused(f"claim {describe(ref)}: " + "; ".join(
            f"{where(device)}: {why}" for device, _, why in refused) + "; nothing was loaded")

    async def _held_by_shares(self, ref: ClaimRef, allocation: ClaimAllocation,
                              shared: list[tuple[PreparedDevice, FunctionSpec | None]],
                              functions: ClaimFunctions) -> list[Outcome]:
        """A share's function must be the one its device holds (a share never programs),
        and the device must still hold the function it was shared with when the share was
        let in (a clear may have run since; it was waited for): ``skipped`` for each share
        whose claim names a function, :class:`Refused` naming both functions when any
        share fails either, before anything of the claim is loaded."""
        assert self.programmer is not None
        outcomes: list[Outcome] = []
        refusals: list[audit.FunctionAudit] = []
        admitted = self._admitted_as(ref.uid)
        for device, spec in shared:
            held = await self.programmer.held_now(device.device_id)
            shared_as = admitted.get(device.device_id)
            why = function_not_held(device, spec, held) if spec is not None else None
            if why is None and shared_as is not None:
                why = not_shared_function(device, shared_as, held)
            if why is not None:
                if spec is not None:
                    family, record = spec.family, self._audit(
                        audit.NOT_HELD, ref, allocation, device, spec, None, why, functions)
                else:
                    assert shared_as is not None
                    family, record = shared_as.family, self._share_audit(
                        ref, allocation, device, shared_as, why)
                metrics.dra_programming(self.driver, family, "", NOT_HELD, 0.0)
                refusals.append(record)
                continue
            if spec is None:  # a share naming no function: nothing to say it skipped
                continue
            outcome = Outcome(device.device_id, spec, OUTCOME_SKIPPED)
            metrics.dra_programming(self.driver, spec.family, "", OUTCOME_SKIPPED, 0.0)
            outcomes.append(outcome)
            if self.auditor.skips_recorded():
                self.auditor.record(self._audit(audit.SKIPPED, ref, allocation, device, spec,
                                                None, outcome.message(), functions))
        if refusals:
            self._refused(ref, refusals)
            raise Refused(f"claim {describe(ref)}: "
                          f"{'; '.join(record.detail for record in refusals)}")
        return outcomes

    def configuration_refused(self, devices: Sequence[PreparedDevice]) -> None:
        if self.programmer is not None:
            self.programmer.configuration_refused(d.device_id for d in devices)

    async def _functions(self, ref: ClaimRef, allocation: ClaimAllocation,
                         devices: Sequence[PreparedDevice]) -> ClaimFunctions:
        mine = [(c.source, c.requests, c.parameters) for c in allocation.configs
                if c.driver == self.driver]
        if not mine:
            return NO_FUNCTIONS
        classes = dict(allocation.classes)
        held = None
        if needs_class_configs(mine, classes) and self._device_classes is not None:
            try:
                held = driver_configs(await self._device_classes(), self.driver)
            except (ApiFailure, TimeoutError) as exc:  # this claim's error; the kubelet retries
                raise Refused(f"claim {describe(ref)}: its DeviceClasses' configurations "
                              f"cannot be read to tell which request each is for: {exc}"
                              ) from None
        try:
            return functions_of(self.driver, mine, classes, held)
        except ValueError as exc:
            self.configuration_refused(devices)
            raise Refused(f"claim {describe(ref)}: {exc}") from None

    def _refused(self, ref: ClaimRef, audits: Sequence[audit.FunctionAudit]) -> None:
        for record in audits:
            self.auditor.record(record)
        if self.refused_in_status is not None and audits:
            self.refused_in_status(ref, audits)

    def _share_audit(self, ref: ClaimRef, allocation: ClaimAllocation,
                     device: PreparedDevice, shared_as: SharedAs,
                     why: str) -> audit.FunctionAudit:
        """The record of a share whose claim names no function, refused because its device
        no longer holds the function it was shared with: that function is the one the
        share was for."""
        return audit.FunctionAudit(
            outcome=audit.NOT_HELD, namespace=ref.namespace, claim=ref.name, uid=ref.uid,
            pods=allocation.reserved_for,
            device_class=ClaimFunctions((), allocation.classes).class_of(device.requests[0]),
            function=shared_as.shown(), image=None, sha256=None, node=self.node,
            device=f"{device.pool}/{device.device}", device_id=device.device_id,
            detail=why, share_id=device.share_id)

    def _audit(self, outcome: str, ref: ClaimRef, allocation: ClaimAllocation,
               device: PreparedDevice, spec: FunctionSpec, sha256: str | None, detail: str,
               functions: ClaimFunctions) -> audit.FunctionAudit:
        return audit.FunctionAudit(
            outcome=outcome, namespace=ref.namespace, claim=ref.name, uid=ref.uid,
            pods=allocation.reserved_for, device_class=functions.class_of(device.requests[0]),
            function=spec.shown(), image=spec.image, sha256=sha256 or spec.sha256,
            node=self.node, device=f"{device.pool}/{device.device}",
            device_id=device.device_id, detail=detail, share_id=device.share_id)
