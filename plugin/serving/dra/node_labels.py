"""The labels of this node's Node object, listed and watched, and read again on demand.

What :mod:`plugin.process.api_label` needs from the API server (and, from the same object,
the runtime :mod:`plugin.serving.runtime_cdi` judges): a list and watch of the one
Node (``fieldSelector=metadata.name=<node>``, RBAC ``nodes`` list and watch), so a label
change is acted on within milliseconds, and a GET (``nodes`` get, which older releases
already had) for a decision to make while the watch is not live. The client is the DRA
driver's own (:class:`~plugin.serving.dra.apiserver.ApiServer`: the pod's service account or
``--kubeconfig``, a token read again at 401), so its watches share one
:mod:`~plugin.serving.dra.watch_pacing`: a proxy that ends every watch at once is backed off,
and said, once for the process.

Never fails its owner: an API server down, slow or refusing (403 where the ClusterRole of an
older release grants ``get`` only) is said once, as a warning naming what is missing, retried
with back-off, and said again (as information) once the watch works; meanwhile the labels
are the ones last read (None: never read, decided as without a label).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from plugin.serving.dra.apiserver import (
    BACKOFF_INITIAL,
    BACKOFF_MAX,
    ApiFailure,
    ApiServer,
    ApiUnavailable,
    Gone,
    retry_pause,
)

log = logging.getLogger(__name__)

WATCH_LIFETIME = 300.0
"""Seconds one watch is followed before it is made anew from a list (as the slice watch)."""
READ_TIMEOUT = 2.0
"""Bound on the GET a decision makes while the watch is not live: a decision must not wait
a whole ``--api-request-timeout`` for the label on top of its own API server calls (a late
label is not lost: the watch brings it, and with it a new decision)."""

Labels = Mapping[str, str]


def labels_of(node: Mapping[str, Any] | None) -> dict[str, str]:
    meta = (node or {}).get("metadata") or {}
    return dict(meta.get("labels") or {})


def runtime_of(node: Mapping[str, Any] | None) -> str:
    """``status.nodeInfo.containerRuntimeVersion`` (``containerd://1.6.20``; empty where the
    kubelet has not reported it)."""
    info = ((node or {}).get("status") or {}).get("nodeInfo") or {}
    return str(info.get("containerRuntimeVersion") or "")


class NodeLabelWatch:
    """Follows the labels of Node ``node``; ``changed(labels)`` at each new value. Also its
    container runtime (the same object, so no other request): ``runtime_changed(version)``
    at each new ``containerRuntimeVersion``, which a kubelet started over another runtime
    writes."""

    def __init__(self, node: str, client: Callable[[], ApiServer],
                 changed: Callable[[Labels], None], *,
                 backoff_max: float = BACKOFF_MAX,
                 runtime_changed: Callable[[str], None] | None = None) -> None:
        self.node = node
        self._client = client
        """The client, made at first use (raises :class:`ApiFailure` when its configuration
        cannot be read); its owner closes it."""
        self._changed = changed
        self._backoff_max = backoff_max
        self.labels: Labels | None = None
        """The labels last read (None: never read)."""
        self._runtime_changed = runtime_changed
        self.runtime: str | None = None
        """The ``containerRuntimeVersion`` last read (None: the Node never read)."""
        self.live = False
        """Listed, and the watch since has not failed: :attr:`labels` is current."""
        self._problem: object = None
        """The kind of failure said last (None: none said, or working again since)."""
        self._retry_after: float | None = None

    async def run(self) -> None:
        """List and watch until cancelled; never raises for the server's sake."""
        delay = BACKOFF_INITIAL
        unexpected: str | None = None
        while True:
            try:
                api = self._client()
                node, version = await api.list_node(self.node)
                self._seen(node)
                self.live = True
                if self._problem is not None:
                    log.info("node %s: its labels are watched again", self.node)
                    self._problem = None
                delay, self._retry_after = BACKOFF_INITIAL, None
                try:
                    async with asyncio.timeout(WATCH_LIFETIME):
                        async for kind, obj in api.watch_node(self.node, version):
                            self._seen(obj, deleted=kind == "DELETED")
                except TimeoutError:
                    continue
            except Gone:
                self.live = False
                continue  # the version listed is too old: list again
            except ApiFailure as failure:
                self.live = False
                self._say(failure)
            except Exception as exc:  # a bug must not leave the label unwatched for good
                self.live = False
                what = f"{type(exc).__name__}: {exc}"
                if what != unexpected:
                    log.error("node %s: watching its labels failed", self.node, exc_info=exc)
                    unexpected = what
            await asyncio.sleep(retry_pause(delay, self._retry_after, self._backoff_max))
            delay = min(delay * 2, self._backoff_max)

    async def read(self) -> Labels | None:
        """The labels now: the watch's while it is live, else a GET; the last read when
        that fails too (said once, as the watch's failures are)."""
        if self.live:
            return self.labels
        try:
            async with asyncio.timeout(READ_TIMEOUT):
                node = await self._client().get_node(self.node)
        except TimeoutError:
            self._say(ApiUnavailable(f"no answer to a GET of the Node within {READ_TIMEOUT:g} s"))
            return self.labels
        except ApiFailure as failure:
            self._say(failure)
            return self.labels
        self._seen(node)
        return self.labels

    def _seen(self, node: Mapping[str, Any] | None, deleted: bool = False) -> None:
        if not deleted:  # a deleted Node says nothing new of the runtime
            runtime = runtime_of(node)
            if runtime != self.runtime:
                self.runtime = runtime
                if self._runtime_changed is not None:
                    self._runtime_changed(runtime)
        labels = {} if deleted else labels_of(node)
        if labels != self.labels:
            self.labels = labels
            self._changed(labels)

    def _say(self, failure: ApiFailure) -> None:
        self._retry_after = failure.retry_after
        state = (type(failure), failure.status)
        if state == self._problem:
            log.debug("node %s: labels: %s", self.node, failure)
            return
        self._problem = state
        missing = (" (the ClusterRole must grant nodes get, list and watch)"
                   if failure.status == 403 else "")
        held = ("the labels last read" if self.labels is not None
                else "no label, as before this release")
        if self.runtime is None:  # fail safe: DRA only where the runtime is known to take it
            held += (" and its container runtime unknown (the device plugin, unless "
                     "--runtime-cdi enabled)")
        log.warning("node %s: cannot follow its labels: %s%s; deciding between the device "
                    "plugin and DRA with %s, and trying again with back-off", self.node,
                    failure, missing, held)
