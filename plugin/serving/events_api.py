"""The API calls behind Kubernetes Events: events.k8s.io/v1 create and patch, and a Node's UID.

The client side of :class:`plugin.process.events.EventSink`, on lightkube like the DRA driver
(plugin/serving/dra/apiserver.py, whose configuration loading, transport and failure
translation it shares): its own client, so an Events call that hangs holds no connection a
claim read needs. Imported only when Events are on. Every call is bounded by
``--api-request-timeout``; every failure becomes a :class:`SinkFailure` naming its kind once
(``HTTP 403``, ``timeout``), which is what the recorder logs once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx2
from lightkube import AsyncClient
from lightkube.generic_resource import create_namespaced_resource
from lightkube.types import PatchType

from plugin.process.events import SinkFailure
from plugin.serving.dra.apiserver import (
    NODES,
    REQUEST_TIMEOUT,
    ApiFailure,
    ApiUnavailable,
    NotFound,
    load_config,
    new_client,
    translate,
)

_EVENTS = create_namespaced_resource("events.k8s.io", "v1", "Event", "events")


class NodeEventSink:
    """Writes the Events of one Node; the client is made at the first call, and made again
    after a configuration that could not be read (no service account yet)."""

    def __init__(self, node: str, kubeconfig: Path | None,
                 timeout: float = REQUEST_TIMEOUT) -> None:
        self.node = node
        self.kubeconfig = kubeconfig
        self.timeout = timeout
        self._client: AsyncClient | None = None

    def _connect(self) -> AsyncClient:
        if self._client is None:
            try:
                config = load_config(self.kubeconfig)
            except ApiFailure as failure:
                raise SinkFailure(str(failure), "configuration", retry=True) from failure
            self._client = new_client(config, self.timeout)
        return self._client

    async def uid(self) -> str | None:
        found = await self._call(self._connect().get(NODES, self.node))
        uid = found.metadata.uid if found.metadata is not None else None
        return str(uid) if uid else None

    async def create(self, namespace: str, event: dict[str, Any]) -> None:
        """A 409 is success: a create retried after a timeout may find the Event made by
        the try that timed out (client-go drops such a write without a word, too)."""
        try:
            await self._call(self._connect().create(_EVENTS(event), namespace=namespace))
        except SinkFailure as failure:
            if failure.kind != "HTTP 409":
                raise

    async def patch(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        await self._call(self._connect().patch(_EVENTS, name, patch, namespace=namespace,
                                               patch_type=PatchType.STRATEGIC))

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def _call(self, awaitable: Any) -> Any:
        try:
            return await awaitable
        except Exception as exc:
            failure = translate(exc)
            raise SinkFailure(str(failure), _kind(exc, failure),
                              retry=isinstance(failure, ApiUnavailable),
                              not_found=isinstance(failure, NotFound)) from exc


def _kind(exc: BaseException, failure: ApiFailure) -> str:
    """What kind of failure, for saying each kind once: a status, or how the call failed."""
    if failure.status is not None:
        return f"HTTP {failure.status}"
    if isinstance(exc, httpx2.TimeoutException):
        return "timeout"
    return "unreachable"
