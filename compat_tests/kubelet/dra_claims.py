"""Preparing and unpreparing claims the way the kubelet's DRA manager does it.

Follows ``prepareResources`` / ``unprepareResources`` of k8s.io/kubernetes
``pkg/kubelet/cm/dra/manager.go`` (1.34-1.36; 1.31-1.33 differ in names, not in these rules):
every driver must be registered before anything is sent; claims go into the claim-info cache
(the checkpoint) before the call; already prepared claims are not sent again; one call per
driver with all its claims; an RPC error aborts the whole operation and its response is
ignored; a claim whose entry carries an error, or a UID nobody asked for, fails the
operation; a claim left out of the response map leaves the operation unfinished, so the
kubelet's next pod sync sends it again. Only when every call succeeded are the claims marked
prepared (or, for unprepare, dropped from the cache). Errors use the kubelet's wording.

Where Go iterates a map (batches, response entries) the emulator goes in request order, so a
test sees the same first error every run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from compat_tests.kubelet.dra_plugin import DraPluginClient
from compat_tests.kubelet.dra_results import (
    ClaimCheckpoint,
    ClaimInfo,
    ClaimRef,
    ClaimResult,
    ClaimsOutcome,
    DriverCall,
)

log = logging.getLogger(__name__)

GetPlugin = Callable[[str], DraPluginClient]
"""The plugin the kubelet would call for a driver; raises LookupError with the kubelet's
words (``DRA driver X is not registered``) when there is none."""


class PluginMissing(LookupError):
    """No plugin is registered for a driver the claim names."""


def missing_plugin_error(driver: str) -> str:
    if not driver:
        return "DRA driver name is empty"
    return f"DRA driver {driver} is not registered"


def _batches(claims: list[ClaimRef]) -> dict[str, list[ClaimRef]]:
    batches: dict[str, list[ClaimRef]] = {}
    for claim in claims:
        for driver in claim.drivers:
            batches.setdefault(driver, []).append(claim)
    return batches


def _check_entries(operation: str, sent: list[ClaimRef], response: Any,
                   results: list[ClaimResult], driver: str,
                   plugin: DraPluginClient) -> str | None:
    """Turn one response into results; the kubelet's first error, or None."""
    first_error: str | None = None
    for claim in sent:
        if claim.uid not in response.claims:
            results.append(ClaimResult(claim, driver, answered=False))
            continue
        entry = response.claims[claim.uid]
        devices = plugin.devices(entry) if operation == "NodePrepareResources" else ()
        results.append(ClaimResult(claim, driver, answered=True, devices=devices,
                                   error=entry.error))
        if entry.error and first_error is None:
            first_error = f"{operation} failed for ResourceClaim {claim.name}: {entry.error}"
    asked = {c.uid for c in sent}
    unknown = sorted(uid for uid in response.claims if uid not in asked)
    if unknown and first_error is None:
        first_error = f"{operation} returned result for unknown claim UID {unknown[0]}"
    unfinished = len(sent) - len(response.claims)
    if unfinished and first_error is None:
        first_error = f"{operation} skipped {unfinished} ResourceClaims"
    return first_error


async def prepare(claims: list[ClaimRef], checkpoint: ClaimCheckpoint,
                  get_plugin: GetPlugin) -> ClaimsOutcome:
    """PrepareResources for one pod's claims."""
    results: list[ClaimResult] = []
    calls: list[DriverCall] = []

    def failed(error: str) -> ClaimsOutcome:
        log.warning("kubelet: prepare dynamic resources: %s", error)
        return ClaimsOutcome(tuple(results), tuple(calls), f"prepare dynamic resources: {error}")

    plugins: dict[str, DraPluginClient] = {}
    for claim in claims:
        for driver in claim.drivers:
            try:
                plugins[driver] = get_plugin(driver)
            except LookupError as exc:
                return failed(str(exc))

    to_send: list[ClaimRef] = []
    for claim in claims:
        info = checkpoint.get(claim)
        if info is None:
            info = ClaimInfo(claim)
            checkpoint.claims[(claim.namespace, claim.name)] = info
        elif info.claim.uid != claim.uid:
            return failed(f"old ResourceClaim with same name {claim.name} and different UID "
                          f"{info.claim.uid} still exists (previous pod force-deleted?!)")
        if info.prepared:
            results.extend(ClaimResult(claim, d, answered=True, devices=info.devices.get(d, ()),
                                       skipped=True) for d in claim.drivers)
            continue
        to_send.append(claim)

    for driver, sent in _batches(to_send).items():
        plugin = plugins[driver]
        response, call = await plugin.call("NodePrepareResources", sent)
        calls.append(call)
        if response is None:
            results.extend(ClaimResult(c, driver, answered=False) for c in sent)
            return failed(f"NodePrepareResources: {call.error}")
        before = len(results)
        error = _check_entries("NodePrepareResources", sent, response, results, driver, plugin)
        for result in results[before:]:
            if result.ok:
                info = checkpoint.get(result.claim)
                if info is not None:
                    info.devices[driver] = result.devices
        if error is not None:
            return failed(error)

    for claim in claims:
        info = checkpoint.get(claim)
        if info is not None:
            info.prepared = True
    return ClaimsOutcome(tuple(results), tuple(calls), None)


async def unprepare(claims: list[ClaimRef], checkpoint: ClaimCheckpoint,
                    get_plugin: GetPlugin) -> ClaimsOutcome:
    """UnprepareResources for one pod's claims; claims the kubelet never cached are skipped."""
    results: list[ClaimResult] = []
    calls: list[DriverCall] = []

    def failed(error: str) -> ClaimsOutcome:
        log.warning("kubelet: unprepare dynamic resources: %s", error)
        return ClaimsOutcome(tuple(results), tuple(calls),
                             f"unprepare dynamic resources: {error}")

    cached: list[ClaimRef] = []
    for claim in claims:
        info = checkpoint.get(claim)
        if info is None:
            results.extend(ClaimResult(claim, d, answered=False, skipped=True)
                           for d in claim.drivers)
            continue
        cached.append(info.claim)  # the kubelet sends what it cached, UID included

    for driver, sent in _batches(cached).items():
        try:
            plugin = get_plugin(driver)
        except LookupError as exc:
            return failed(str(exc))
        response, call = await plugin.call("NodeUnprepareResources", sent)
        calls.append(call)
        if response is None:
            results.extend(ClaimResult(c, driver, answered=False) for c in sent)
            return failed(f"NodeUnprepareResources: {call.error}")
        error = _check_entries("NodeUnprepareResources", sent, response, results, driver, plugin)
        if error is not None:
            return failed(error)

    for claim in cached:
        checkpoint.claims.pop((claim.namespace, claim.name), None)
    return ClaimsOutcome(tuple(results), tuple(calls), None)
