"""One reconciler makes the API server's ResourceSlices of this node agree with its devices.

What should be published is a pure function of the devices (``build``, from ``api_versions``);
this loop only makes it so, against whatever happens to the slices meanwhile:

* the devices change (hot-plug, health): the pool is published again under a higher
  ``pool.generation``, so the scheduler never mixes two views of the node;
* the kubelet deletes every slice of its node at each start (and the driver's once its last
  registration is gone): the watch sees the deletions and the pool is back within
  milliseconds, not at the next resync;
* someone else changes or adds a slice with our driver and node: ours are written again,
  theirs deleted (one pool, one writer);
* the server drops device taints (DRADeviceTaints off): seen in what it stored, after which
  unhealthy devices are left out instead, so the scheduler never picks them;
* the API server is down, slow, refusing or serves another version after an upgrade:
  retried with back-off, each state logged once, and the version found again.

A slice is rewritten only when what this driver would write differs from what it wrote last,
or when the stored object is not the one it wrote (its resourceVersion moved): the server
rewrites some values as it stores them (quantities, defaults), so comparing against what it
stored would rewrite for ever. A wake that finds the content unchanged (a claim prepared
while sharing is on: what claims hold decides how a device is published) costs no request,
unless the watch saw the slices change since they were last listed: the watch, not a list at
every wake, is what notices someone else's hand.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from api_versions.k8s_objects import (
    KubeObject,
    as_replacement,
    name_of,
    pool_generation_of,
    resource_version_of,
)
from api_versions.resource_slices import dropped_binding, dropped_sharing, dropped_taints
from plugin.model.allocation import name_some
from plugin.process import metrics
from plugin.serving.dra.apiserver import (
    BACKOFF_INITIAL,
    BACKOFF_MAX,
    ApiFailure,
    ApiRefused,
    ApiServer,
    Conflict,
    Gone,
    retry_pause,
)

log = logging.getLogger(__name__)

Build = Callable[[str, int, str, bool], list[KubeObject]]
"""``(resource.k8s.io version, pool generation, node UID, taints kept)`` -> the slices, unnamed."""

WATCH_LIFETIME = 300.0
"""Seconds one slice watch is followed before it is made anew from a list (the Go
reflector asks the server to end its watches after 5 to 10 minutes for the same reason)."""
EXPIRED_STREAK = 10.0
"""A watch answered 410 within this many seconds of its list is one of a streak (a server
that expires every version at once), backed off from the second on."""


SHARING_DROPPED = ("DRAConsumableCapacity", "they are allocated whole, one claim at a time, "
                   "and --dra-share shares nothing there")
"""The gate whose absence drops ``allowMultipleAllocations``, and what that means: the
scheduler allocates those devices whole, which prepare serves as any whole claim."""
BINDING_DROPPED = ("DRADeviceBindingConditions or DRAResourceClaimDeviceStatus",
                   "--program-at bind has no effect there, functions are loaded at prepare "
                   "and a failed load does not move the pod")
"""The same for ``bindingConditions``: the scheduler binds at once, and functions are loaded
at prepare, as with ``--program-at prepare``."""


class SlicePublisher:
    """Keeps one pool (this driver on this node) published; see the module docstring."""

    def __init__(self, api: ApiServer, node: str, driver: str, build: Build, *,
                 backoff_max: float = BACKOFF_MAX) -> None:
        self._api = api
        self.node = node
        self.driver = driver
        self._build = build
        self._backoff_max = backoff_max
        self._selector = {"spec.nodeName": node, "spec.driver": driver}
        self._wanted = asyncio.Event()
        self._wanted.set()
        self._written: dict[str, str] = {}
        """Name -> resourceVersion the server gave our last write of that slice."""
        self._last_content: list[KubeObject] | None = None
        self._last_version: str | None = None
        self._generation = 0
        self._seen = 1
        """Bumped by the watch at every sign that the stored slices are not those written."""
        self._checked = 0
        """``_seen`` as it was when a list last found the slices as written (-1: a write
        since then may have been cut off)."""
        self._taints = True
        self._dropped_said: dict[str, str] = {}
        """Field the server dropped -> the resource.k8s.io version that was said for."""
        self._node_uid: str | None = None
        self._state: object = None
        """What kind of failure was said last (None: publishing works)."""
        self.publications = 0
        """How many times the pool was (re)published: for status lines and tests."""
        self.in_sync: bool | None = None
        """Whether the last reconciliation wrote (or found) the slices as the devices are;
        None before the first one ended. Read by the readiness probe."""
        self.problem: str | None = None
        """Why the last reconciliation failed (None: it did not)."""

    @property
    def generation(self) -> int:
        return self._generation

    def devices_changed(self) -> None:
        """The devices (or their health) changed: publish again."""
        self._wanted.set()

    async def run(self) -> None:
        """Publish and keep published until cancelled; never raises for the server's sake."""
        watcher = asyncio.create_task(self._watch(), name="resource slice watch")
        try:
            await self._reconcile_forever()
        finally:
            metrics.dra_slices(self.driver, None)
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    async def withdraw(self) -> None:
        """Delete this pool's slices (the driver is going away for good): those it wrote and
        those the server lists for the pool, since a write cut off by the cancellation that
        precedes a withdrawal may still have been stored without its answer being read."""
        names = set(self._written)
        with contextlib.suppress(ApiFailure):
            existing, _ = await self._api.list_slices(self._selector)
            names |= {name_of(obj) for obj in existing}
        for name in sorted(names):
            with contextlib.suppress(ApiFailure):
                await self._api.delete_slice(name)
        self._written.clear()

    async def _reconcile_forever(self) -> None:
        delay = BACKOFF_INITIAL
        conflicts = 0
        while True:
            await self._wanted.wait()
            self._wanted.clear()
            try:
                await self._reconcile()
            except Conflict as conflict:
                # Someone wrote in between: read again at once. One who keeps doing it (a
                # second instance of this driver, a controller undoing our writes) is
                # backed off like any failure, and said once.
                self._wanted.set()
                conflicts += 1
                if conflicts > 1:
                    self._say(conflict, f"the slices of {self.node} keep changing under "
                              f"this driver (409 Conflict: {conflict}); another writer? "
                              "retrying", logging.WARNING)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self._backoff_max)
                continue
            except ApiRefused as refusal:
                if not self._taints_unknown_to(refusal):
                    self._say(refusal, f"cannot publish the devices of {self.node}: {refusal}; "
                              "retrying", logging.ERROR)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self._backoff_max)
                self._wanted.set()
                continue
            except ApiFailure as failure:
                self._say(failure, f"cannot publish the devices of {self.node}: {failure}; "
                          "retrying", logging.WARNING)
                self._node_uid = None if failure.status in (404, None) else self._node_uid
                await asyncio.sleep(retry_pause(delay, failure.retry_after, self._backoff_max))
                delay = min(delay * 2, self._backoff_max)
                self._wanted.set()
                continue
            metrics.dra_slices(self.driver, True)
            self.in_sync, self.problem = True, None
            if self._state is not None:
                log.info("the API server answers again; the devices of %s are published",
                         self.node)
                self._state = None
            delay = BACKOFF_INITIAL
            conflicts = 0

    async def _reconcile(self) -> None:
        version = await self._api.resource_version()
        if self._last_version not in (None, version):
            # Upgraded or downgraded behind the same address: whether it keeps taints is
            # learnt again from what it stores.
            log.info("the API server now serves resource.k8s.io/%s (was %s); publishing "
                     "the devices of %s through it", version, self._last_version, self.node)
            self._taints = True
        if self._node_uid is None:
            self._node_uid = await self._api.node_uid(self.node)
        content = self._build(version, 0, self._node_uid, self._taints)
        unchanged = content == self._last_content and version == self._last_version
        if unchanged and self._checked == self._seen:
            return
        seen, self._checked = self._seen, -1
        existing, _ = await self._api.list_slices(self._selector)
        stored = {name_of(o): resource_version_of(o) for o in existing}
        if unchanged and stored == self._written:
            self._checked = seen
            return
        if self._last_content is None and self._adopt(version, content, existing):
            self._checked = seen
            return
        self._generation = max([self._generation, *map(pool_generation_of, existing)]) + 1
        wanted = self._build(version, self._generation, self._node_uid, self._taints)
        existing.sort(key=name_of)
        written: dict[str, str] = {}
        for index, obj in enumerate(wanted):
            if index < len(existing):
                old = existing[index]
                stored_obj = await self._api.replace_slice(
                    as_replacement(obj, name_of(old), resource_version_of(old)))
            else:
                stored_obj = await self._api.create_slice(obj)
            written[name_of(stored_obj)] = resource_version_of(stored_obj)
            self._written = dict(written)
            if self._taints and dropped_taints(version, obj, stored_obj):
                log.warning("the API server dropped device taints (DRADeviceTaints off); "
                            "unhealthy devices are left out of the slices instead")
                self._taints = False
                self._wanted.set()
            self._say_dropped("allowMultipleAllocations", version,
                              dropped_sharing(version, obj, stored_obj), SHARING_DROPPED)
            self._say_dropped("bindingConditions", version,
                              dropped_binding(version, obj, stored_obj), BINDING_DROPPED)
        for extra in existing[len(wanted):]:
            await self._api.delete_slice(name_of(extra))
        self._written = written
        self._last_content = content
        self._last_version = version
        self._checked = seen
        self.publications += 1
        metrics.dra_slices_published(self.driver)
        log.info("published %d device slice(s) of %s as pool generation %d "
                 "(resource.k8s.io/%s)", len(wanted), self.node, self._generation, version)

    def _say_dropped(self, field: str, version: str, dropped: list[str],
                     why: tuple[str, str]) -> None:
        """Warn, once per server version, that the server dropped ``field`` from the devices
        ``dropped``: which gate is off there, and what that means (``why``). Nothing to
        publish otherwise, but an admin who turned the feature on must learn why it does
        nothing there."""
        if not dropped or self._dropped_said.get(field) == version:
            return
        self._dropped_said[field] = version
        gate, effect = why
        log.warning("the API server dropped %s from %s (resource.k8s.io/%s; %s off, the default "
                    "before Kubernetes 1.36): %s", field, name_some(dropped), version, gate,
                    effect)

    def _adopt(self, version: str, content: Any, existing: list[Any]) -> bool:
        """Take over the pool as it stands if it is exactly what this instance would write.

        A rolling update starts a new instance while the old one's slices are published: the
        same devices, the same content. Writing them again under a higher generation would
        be churn every watcher of slices pays for (and a window in which the scheduler sees
        a pool being replaced); the newcomer takes them as its own instead. Anything that
        differs (other devices, a server that stored them otherwise) is written as usual.
        """
        generations = {pool_generation_of(o) for o in existing}
        if len(generations) != 1:
            return False
        generation = generations.pop()
        wanted = self._build(version, generation, self._node_uid, self._taints)
        ordered = sorted(existing, key=name_of)
        if len(wanted) != len(ordered) or any(
                w.get("spec") != o.get("spec") for w, o in zip(wanted, ordered, strict=True)):
            return False
        self._generation = generation
        self._written = {name_of(o): resource_version_of(o) for o in ordered}
        self._last_content, self._last_version = content, version
        log.info("the %d device slice(s) of %s already published (pool generation %d) are "
                 "what this instance would publish; taking them over unchanged",
                 len(ordered), self.node, generation)
        return True

    async def _watch(self) -> None:
        """Wake the reconciler when a slice of ours is deleted or changed by someone else.

        Never ends on its own: every failure is retried with back-off, so the slices a
        kubelet start wipes are always noticed. A 410 (the version listed is too old) lists
        again at once; a server that answers 410 again and again is backed off too. A watch
        is given up after ``WATCH_LIFETIME`` and made anew from a list: the stream has no
        read timeout (it may be quiet for hours), so a connection that died without a word
        (a load balancer failing over, a peer gone without a reset) would otherwise be
        waited on for ever."""
        loop = asyncio.get_running_loop()
        delay = BACKOFF_INITIAL
        expired = 0
        unexpected: str | None = None
        while True:
            listed_at = loop.time()
            try:
                items, resource_version = await self._api.list_slices(self._selector)
                self._notice({name_of(o): resource_version_of(o) for o in items})
                delay = BACKOFF_INITIAL
                try:
                    async with asyncio.timeout(WATCH_LIFETIME):
                        async for kind, obj in self._api.watch_slices(self._selector,
                                                                      resource_version):
                            expired = 0
                            self._notice_event(kind, obj)
                except TimeoutError:
                    log.debug("slice watch: %g s on one connection; listing and watching "
                              "again", WATCH_LIFETIME)
                    continue
            except Gone as gone:
                if loop.time() - listed_at > EXPIRED_STREAK:
                    expired = 0
                expired += 1
                if expired == 1:  # routine: the server compacted past the version listed
                    log.debug("slice watch: %s (410 Gone); listing again", gone)
                    continue
                if expired == 2:
                    log.warning("slice watch: the API server answers 410 Gone even right "
                                "after a list; watching again with back-off")
                await asyncio.sleep(min(BACKOFF_INITIAL * 2 ** (expired - 2), self._backoff_max))
                continue
            except ApiFailure as failure:
                log.debug("slice watch: %s; watching again in %.1f s", failure, delay)
                await asyncio.sleep(retry_pause(delay, failure.retry_after, self._backoff_max))
                delay = min(delay * 2, self._backoff_max)
                continue
            except Exception as exc:  # a bug must not leave the slices unwatched for good
                what = f"{type(exc).__name__}: {exc}"
                if what != unexpected:
                    log.error("slice watch failed; watching again in %.1f s", delay,
                              exc_info=exc)
                    unexpected = what
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._backoff_max)

    def _taints_unknown_to(self, refusal: ApiRefused) -> bool:
        """A server whose resource.k8s.io has no taints field at all (1.32) refuses the
        whole slice (400, unknown field): publish without taints, unhealthy devices left out."""
        if not self._taints or refusal.status != 400 or "taints" not in str(refusal):
            return False
        log.warning("the API server does not know device taints (%s); unhealthy devices are "
                    "left out of the slices instead", refusal)
        self._taints = False
        return True

    def _notice(self, stored: dict[str, str]) -> None:
        """After a list: wake the reconciler if the slices are not those it wrote, or were
        written in a version the server no longer serves."""
        if stored != self._written or self._api.version != self._last_version:
            self._seen += 1
            self._wanted.set()

    def _notice_event(self, kind: str, obj: Any) -> None:
        name = name_of(obj)
        if kind == "DELETED":
            if name in self._written:
                log.info("slice %s was deleted (kubelet start?); publishing again", name)
                self._seen += 1
                self._wanted.set()
        elif kind in ("ADDED", "MODIFIED") and self._written.get(name) != \
                resource_version_of(obj):
            self._seen += 1
            self._wanted.set()

    def _say(self, failure: ApiFailure, message: str, level: int) -> None:
        """Log a failing state once, not at every retry. A state is the failure's kind
        (class and HTTP status), not its wording, which may change from one try to the next
        (a refused connection, then a connect timeout, during one outage). Every failure to
        publish comes through here, so it is also where the slices are counted out of sync."""
        metrics.dra_slices(self.driver, False)
        self.in_sync, self.problem = False, message
        state = (type(failure), failure.status)
        if state != self._state:
            self._state = state
            log.log(level, message)
