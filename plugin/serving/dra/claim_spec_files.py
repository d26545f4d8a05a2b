"""Writing and removing the claims' own CDI specs, a call's worth at a time.

A few specs are written right on the event loop: one is a few hundred bytes into a tmpfs,
less than the hop to a worker thread costs, and the kubelet waits on it. A call with many
claims writes them on one worker thread so the event loop keeps answering; if the call is
cancelled meanwhile, the specs written are removed again once the thread is done.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from plugin.serving.dra.claim_cdi import ClaimSpecs, Share
from plugin.serving.dra.prepared import PreparedClaim, describe
from value_types.claims import ClaimResult, PreparedDevice

log = logging.getLogger(__name__)

INLINE_FILE_OPS = 8
"""Claim specs a call writes or removes on the event loop; more go to a worker thread."""


async def write_specs(specs: ClaimSpecs | None, prepared: list[PreparedClaim],
                      results: dict[str, ClaimResult]) -> list[PreparedClaim]:
    """The claims whose spec is written (or that need none); the others get an error in
    ``results``."""
    jobs = [(c.ref.uid, groups(c.devices), share_groups(c.devices)) for c in prepared
            if c.claim_spec is not None]
    if specs is None or not jobs:
        return prepared
    if len(jobs) <= INLINE_FILE_OPS:
        failures = _write_all(specs, jobs)
    else:
        writing = asyncio.ensure_future(asyncio.to_thread(_write_all, specs, jobs))
        try:
            failures = await asyncio.shield(writing)
        except asyncio.CancelledError:
            await asyncio.wait([writing])
            await remove_specs(specs, [(uid, specs.file_name(uid)) for uid, _, _ in jobs])
            raise
    written = []
    for claim in prepared:
        exc = failures.get(claim.ref.uid)
        if exc is None:
            written.append(claim)
            continue
        error = (f"cannot write the CDI spec of claim {describe(claim.ref)} into "
                 f"{specs.directory}: {exc.strerror or exc}")
        results[claim.ref.uid] = ClaimResult(error=error)
        log.warning("refused to prepare claim %s: %s", describe(claim.ref), error)
    return written


async def remove_specs(specs: ClaimSpecs | None,
                       claims: list[tuple[str, str | None]]) -> None:
    """Remove claims' specs: a few right here, many on a worker thread."""
    if specs is None or not claims:
        return
    if len(claims) <= INLINE_FILE_OPS:
        _remove_all(specs, claims)
    else:
        await asyncio.to_thread(_remove_all, specs, claims)


def _write_all(specs: ClaimSpecs, jobs: list[tuple[str, dict[str, list[str]],
                                                 dict[str, list[Share]]]]
               ) -> dict[str, OSError]:
    """Write each claim's spec; the ones that could not be, by claim UID."""
    failures = {}
    for uid, device_groups, shares in jobs:
        try:
            specs.write(uid, device_groups, shares)
        except OSError as exc:
            failures[uid] = exc
    return failures


def _remove_all(specs: ClaimSpecs, claims: list[tuple[str, str | None]]) -> None:
    for uid, file_name in claims:
        specs.remove(uid, file_name)


def groups(devices: Sequence[PreparedDevice]) -> dict[str, list[str]]:
    """Base request -> its device IDs in allocation order (what each container gets)."""
    found: dict[str, list[str]] = {}
    for device in devices:
        for request in device.request_names:
            found.setdefault(request, []).append(device.device_id)
    return found


def share_groups(devices: Sequence[PreparedDevice]) -> dict[str, list[Share]]:
    """Base request -> (share ID, contexts) of each of its devices, aligned with
    :func:`groups` (None for a device held whole)."""
    found: dict[str, list[Share]] = {}
    for device in devices:
        share = (device.share_id, device.contexts or 1) if device.share_id else None
        for request in device.request_names:
            found.setdefault(request, []).append(share)
    return found
