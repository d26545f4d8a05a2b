"""Following every ResourceClaim, for the claims whose pods wait on this driver to bind.

A list, then a watch from its resourceVersion, made anew after ``WATCH_LIFETIME`` (a dead
connection would otherwise be waited on for ever) or after a 410 (the version is too old),
every failure retried with back-off: the scheduler waits on the claims this shows
(:class:`~plugin.serving.dra.binding.BindingLoader`), so it must never stop for good. No
field selector narrows claims to a node or a driver; the loader picks its own, and a claim
it cannot read is skipped, never fatal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol

from api_versions.claim_status import status_apply
from api_versions.k8s_objects import api_version_of
from api_versions.resource_claims import claim_ref
from plugin.serving.dra.apiserver import (
    BACKOFF_INITIAL,
    BACKOFF_MAX,
    ApiFailure,
    ApiServer,
    Gone,
    retry_pause,
)
from plugin.serving.dra.binding import BindingLoader
from plugin.serving.dra.function_audit import Auditor, ClaimTold
from plugin.serving.dra.prepare_functions import FunctionStep
from value_types.claims import ClaimRef, DeviceStatusReport

if TYPE_CHECKING:
    from plugin.serving.dra.prepare import ClaimPreparer

log = logging.getLogger(__name__)

WATCH_LIFETIME = 300.0


class Place(Protocol):
    @property
    def program_at(self) -> str: ...

    @property
    def driver(self) -> str: ...

    @property
    def node(self) -> str: ...


class BindingSide:
    """The driver's part in binding (``--program-at bind``): a :class:`BindingLoader` fed by
    :func:`follow_claims`, run while the driver publishes (only the instance that holds the
    driver's socket, and so its checkpoint, loads anything)."""

    def __init__(self, place: Place, api: ApiServer, preparer: ClaimPreparer,
                 claim_told: ClaimTold | None) -> None:
        self._place, self._api, self._preparer = place, api, preparer
        self._claim_told = claim_told
        self.loader: BindingLoader | None = None
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def of(cls, place: Place, api: ApiServer, preparer: ClaimPreparer,
           claim_told: ClaimTold | None) -> BindingSide | None:
        """None unless functions are loaded before binding: ``--program-at bind`` with
        ``--programming on``."""
        programmer = preparer.programmer
        if place.program_at != "bind" or programmer is None or not programmer.enabled:
            return None
        return cls(place, api, preparer, claim_told)

    def start(self, device_names: Callable[[], Mapping[str, str]]) -> None:
        if self._task is not None:
            return
        place, api, preparer = self._place, self._api, self._preparer
        programmer = preparer.programmer
        assert programmer is not None
        manager = f"{place.driver}/binding"

        async def write(ref: ClaimRef, reports: tuple[DeviceStatusReport, ...]) -> None:
            await api.apply_claim_status(lambda version: status_apply(version, ref, reports),
                                         field_manager=manager)

        checkpoint = preparer.checkpoint
        functions = FunctionStep(place.driver, place.node, programmer,
                                 lambda uid, device_id: checkpoint.holders(device_id, but=uid),
                                 Auditor(self._claim_told), device_classes=api.device_classes)
        loader = self.loader = BindingLoader(place.driver, place.node, device_names,
                                             preparer._devices, functions, programmer,
                                             checkpoint, write)
        self._task = asyncio.create_task(follow_claims(api, loader),
                                         name="claims waiting to bind")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.loader is not None:
            await self.loader.close()


async def follow_claims(api: ApiServer, loader: BindingLoader,
                        backoff_max: float = BACKOFF_MAX) -> None:
    """Tell ``loader`` of every claim listed or changed until cancelled; never raises."""
    delay = BACKOFF_INITIAL
    said: str | None = None
    while True:
        try:
            items, resource_version = await api.list_claims()
            uids = set()
            for obj in items:
                loader.seen(api_version_of(obj), obj)
                uids.add(str((obj.get("metadata") or {}).get("uid", "")))
            loader.listed(uids)
            delay, said = BACKOFF_INITIAL, None
            try:
                async with asyncio.timeout(WATCH_LIFETIME):
                    async for kind, obj in api.watch_claims(resource_version):
                        _tell(loader, kind, obj)
            except TimeoutError:
                continue
        except Gone:
            continue
        except ApiFailure as failure:
            what = f"{type(failure).__name__} {failure.status}"
            if what != said:
                said = what
                log.warning("cannot follow the claims waiting on this driver to bind: %s%s; "
                            "trying again with back-off", failure,
                            " (the driver needs list and watch on resourceclaims)"
                            if failure.status == 403 else "")
            await asyncio.sleep(retry_pause(delay, failure.retry_after, backoff_max))
            delay = min(delay * 2, backoff_max)
            continue
        except Exception:  # a bug must not leave the scheduler waiting for good
            log.exception("claim watch failed; watching again in %.1f s", delay)
        await asyncio.sleep(delay)
        delay = min(delay * 2, backoff_max)


def _tell(loader: BindingLoader, kind: str, obj: dict[str, object]) -> None:
    version = api_version_of(obj)
    if kind == "DELETED":
        try:
            loader.gone(claim_ref(version, obj).uid)
        except ValueError:
            return
    elif kind in ("ADDED", "MODIFIED"):
        loader.seen(version, obj)
