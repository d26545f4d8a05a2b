"""The API server as the DRA driver needs it: a handful of calls in one resource.k8s.io version.

Imported only when DRA is served, so a device-plugin-only node never loads the client library
(the daemon imports this package lazily). The library is lightkube: made for the Kubernetes
API, asyncio-native, generic resources for any group and version (the driver works on plain
dicts built in ``api_versions``, so generated models would only cost memory), field-selected
list and watch, a typed error carrying the server's Status, and a service-account token read
again when the server answers 401 (bound tokens rotate under a running pod).

Which version: v1, then v1beta2, then v1beta1, moving on at 404, as the Go helper's client
does; the answer is remembered, and a 404 later (an API server upgraded or downgraded behind
the same address) forgets it so the next call finds it again. Every failure becomes one of
a few kinds the callers act on: :class:`ApiUnavailable` (connection refused, timeout, 5xx,
429: retry with back-off), :class:`ApiRefused` (401, 403, 400, 422: the server said no, and
why), :class:`Conflict` (409), :class:`Gone` (410: watch again from a fresh list),
:class:`NotFound`, :class:`NoResourceApi` (no version this driver speaks is served).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx2
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.config.client_adapter import verify_cluster
from lightkube.core.exceptions import ConfigError
from lightkube.generic_resource import create_global_resource, create_namespaced_resource
from lightkube.types import PatchType

from api_versions.k8s_objects import api_version_of
from api_versions.resource_versions import GROUP, KNOWN_VERSIONS, newest_first
from plugin.serving.dra.watch_pacing import WatchPacing

log = logging.getLogger(__name__)
# The HTTP library says every request at info: one line per call and per retry.
logging.getLogger("httpx2").setLevel(max(logging.getLogger().level, logging.WARNING))

REQUEST_TIMEOUT = 10.0
"""Seconds for one call; a watch's stream has no read timeout (the server ends it)."""
FIELD_MANAGER = "accelerator-device-plugin"
T = TypeVar("T")


class ApiFailure(Exception):
    """A call to the API server that did not do what was asked."""

    def __init__(self, message: str, status: int | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after
        """Seconds the server asked to wait before trying again (``Retry-After``: 429 from
        priority and fairness, some 503s), None when it did not say."""


BACKOFF_INITIAL = 0.2
BACKOFF_MAX = 30.0
"""The back-off of the driver's loops that talk to the API server: from 0.2 s, doubling,
to 30 s, as client-go's."""


def retry_pause(delay: float, retry_after: float | None, longest: float) -> float:
    """The back-off ``delay``, or the server's ``Retry-After`` (429 from priority and
    fairness, some 503s) when it asks for longer, never beyond ``longest``."""
    return min(max(delay, retry_after or 0.0), longest)


class ApiUnavailable(ApiFailure):
    """Down, slow, overloaded or failing: worth trying again later."""


class ApiRefused(ApiFailure):
    """The server understood and said no (credentials, RBAC, validation)."""


class NotFound(ApiFailure):
    def __init__(self, message: str, unserved: bool = False) -> None:
        super().__init__(message, 404)
        self.unserved = unserved
        """True when the path itself is not served (a version the server lacks), not an
        object that does not exist."""


class Conflict(ApiFailure):
    """Someone else changed the object since it was read (409)."""


class Gone(ApiFailure):
    """A watch's resourceVersion is too old (410): list again."""


class NoResourceApi(ApiFailure):
    """The server serves none of the resource.k8s.io versions this driver speaks."""


def load_config(kubeconfig: Path | None) -> KubeConfig:
    """``--kubeconfig`` when given; in a pod, its service account (token, CA, and
    ``KUBERNETES_SERVICE_HOST``/``PORT``).

    A token file (the service account's, or a kubeconfig's ``tokenFile``) is read again
    whenever the server answers 401, so a rotated token is picked up without a restart. A
    relative ``tokenFile`` is found beside the kubeconfig, as kubectl and client-go find it
    (the library would look in the working directory)."""
    try:
        if kubeconfig is not None:
            config = KubeConfig.from_file(kubeconfig)
            for user in config.users.values():
                if user.token_file and not Path(user.token_file).expanduser().is_absolute():
                    user.token_file = str(Path(kubeconfig).parent / user.token_file)
            return config
        return KubeConfig.from_service_account()
    except (ConfigError, OSError, KeyError, ValueError) as exc:
        where = str(kubeconfig) if kubeconfig else "the pod's service account"
        raise ApiRefused(f"cannot use {where} to reach the API server: {exc}") from exc


class ApiServer:
    """The calls the driver makes, in the resource.k8s.io version the server serves."""

    def __init__(self, config: KubeConfig, timeout: float = REQUEST_TIMEOUT) -> None:
        self._client = new_client(config, timeout)
        self._version: str | None = None
        self._resources: dict[tuple[str, str], Any] = {}

    @classmethod
    def connect(cls, kubeconfig: Path | None, timeout: float = REQUEST_TIMEOUT) -> ApiServer:
        return cls(load_config(kubeconfig), timeout)

    async def close(self) -> None:
        await self._client.close()

    @property
    def version(self) -> str | None:
        """The resource.k8s.io version found last, None before the first call."""
        return self._version

    async def resource_version(self) -> str:
        """The newest spoken version the server serves, found once and remembered."""
        if self._version is not None:
            return self._version
        for version in newest_first(KNOWN_VERSIONS):
            try:
                async for _ in _guard(self._client.list(self._slices(version), chunk_size=1),
                                      lambda: None):
                    break
            except NotFound:
                continue
            if self._version != version:
                log.info("API server serves resource.k8s.io/%s; using it", version)
            self._version = version
            return version
        raise NoResourceApi(f"the API server serves none of resource.k8s.io "
                            f"{', '.join(KNOWN_VERSIONS)} (DRA not enabled there?)", 404)

    async def node_uid(self, node: str) -> str:
        found = await self._call(self._client.get(NODES, node))
        return str(found.metadata.uid)

    async def get_node(self, node: str) -> dict[str, Any]:
        return _plain(await self._call(self._client.get(NODES, node)))

    async def get_namespace(self, name: str) -> dict[str, Any]:  # its labels: the grants
        return _plain(await self._call(self._client.get(NAMESPACES, name)))

    async def config_maps(self, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        """The ConfigMaps of ``namespace`` carrying ``labels`` (the function catalogue)."""
        listing = self._client.list(CONFIG_MAPS, namespace=namespace, labels=labels)
        return [_plain(o) async for o in _guard(listing, lambda: None)]

    async def list_node(self, node: str) -> tuple[dict[str, Any] | None, str]:
        """This node's Node object (None when there is none) and the list's resourceVersion,
        to watch from: a list and watch narrowed to one name, as client-go's reflector does
        for a single object (``fieldSelector=metadata.name=<node>``)."""
        listing = self._client.list(NODES, fields={"metadata.name": node})
        items = [_plain(o) async for o in _guard(listing, lambda: None)]
        return (items[0] if items else None), str(listing.resourceVersion)

    async def watch_node(self, node: str, resource_version: str,
                         ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Changes to this node's Node object after ``resource_version`` (see
        :meth:`watch_slices` for how the stream ends)."""
        events = self._client.watch(NODES, fields={"metadata.name": node},
                                    resource_version=resource_version)
        async for kind, obj in _guard(events, lambda: None):
            yield kind, _plain(obj)

    async def list_slices(self, selector: dict[str, str]) -> tuple[list[dict[str, Any]], str]:
        """The slices the field ``selector`` picks, and the list's resourceVersion."""

        async def in_version(version: str) -> tuple[list[dict[str, Any]], str]:
            listing = self._client.list(self._slices(version), fields=selector)
            items = [_plain(o) async for o in _guard(listing, self._forget_on_404)]
            return items, str(listing.resourceVersion)

        return await self._in_served_version(in_version)

    async def watch_slices(
        self, selector: dict[str, str], resource_version: str,
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Changes to the selected slices after ``resource_version``; raises :class:`Gone`
        when the version is too old. A stream the server ends cleanly is made anew by the
        library from the last version seen (paced by :mod:`.watch_pacing`), so this ends
        only by failing or by its reader giving it up."""
        version = await self.resource_version()
        events = self._client.watch(self._slices(version), fields=selector,
                                    resource_version=resource_version)
        async for kind, obj in _guard(events, self._forget_on_404):
            yield kind, _plain(obj)

    async def create_slice(self, obj: dict[str, Any]) -> dict[str, Any]:
        resource = self._slices(api_version_of(obj))
        return _plain(await self._call(self._client.create(resource(obj))))

    async def replace_slice(self, obj: dict[str, Any]) -> dict[str, Any]:
        resource = self._slices(api_version_of(obj))
        return _plain(await self._call(self._client.replace(resource(obj))))

    async def delete_slice(self, name: str) -> None:
        async def in_version(version: str) -> None:
            try:
                await self._call(self._client.delete(self._slices(version), name))
            except NotFound as exc:
                if exc.unserved:  # the version is gone, not the slice
                    raise
                # the slice is gone already: what was wanted

        await self._in_served_version(in_version)

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        """The claim, with the ``apiVersion`` it was read in."""

        async def in_version(version: str) -> dict[str, Any]:
            resource = self._resource(version, "ResourceClaim", "resourceclaims",
                                      namespaced=True)
            found = _plain(await self._call(self._client.get(resource, name,
                                                             namespace=namespace)))
            found.setdefault("apiVersion", f"{GROUP}/{version}")
            return found

        return await self._in_served_version(in_version)

    async def list_claims(self) -> tuple[list[dict[str, Any]], str]:
        """Every claim of every namespace (no field selector narrows claims to a node or a
        driver), each with its ``apiVersion``, and the list's resourceVersion."""

        async def in_version(version: str) -> tuple[list[dict[str, Any]], str]:
            listing = self._client.list(self._resource(
                version, "ResourceClaim", "resourceclaims", namespaced=True), namespace="*")
            items = [_versioned(_plain(o), version)
                     async for o in _guard(listing, self._forget_on_404)]
            return items, str(listing.resourceVersion)

        return await self._in_served_version(in_version)

    async def watch_claims(self, resource_version: str,
                           ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Changes to any claim after ``resource_version`` (as :meth:`watch_slices`)."""
        version = await self.resource_version()
        events = self._client.watch(self._resource(version, "ResourceClaim", "resourceclaims",
                                                   namespaced=True),
                                    namespace="*", resource_version=resource_version)
        async for kind, obj in _guard(events, self._forget_on_404):
            yield kind, _versioned(_plain(obj), version)

    async def apply_claim_status(self, build: Callable[[str], dict[str, Any]],
                                 field_manager: str) -> dict[str, Any]:
        """Server-side apply ``build(version)`` (a claim's status apply configuration) to
        the claim's ``status`` subresource, as ``field_manager``, forcing ownership.

        Apply rather than update or merge patch: ``status.devices`` is a list map whose
        entries belong to their drivers, and an apply by one manager sets and removes only
        the entries that manager owns, with no read first and no conflict with the
        scheduler's writes or another driver's entries (kubernetes-sigs/dranet
        ``pkg/driver/nri_hooks.go`` applies its claims' status the same way: field manager
        the driver name, ``Force: true``)."""

        async def in_version(version: str) -> dict[str, Any]:
            obj = build(version)
            meta = obj["metadata"]
            resource = self._resource(version, "ResourceClaim", "resourceclaims",
                                      namespaced=True)
            return _plain(await self._call(self._client.patch(
                resource.Status, meta["name"], obj, namespace=meta["namespace"],
                patch_type=PatchType.APPLY, field_manager=field_manager, force=True)))

        return await self._in_served_version(in_version)

    async def device_classes(self) -> list[dict[str, Any]]:
        async def in_version(version: str) -> list[dict[str, Any]]:
            resource = self._resource(version, "DeviceClass", "deviceclasses")
            listing = self._client.list(resource)
            return [_plain(o) async for o in _guard(listing, self._forget_on_404)]

        return await self._in_served_version(in_version)

    async def _in_served_version(self, call: Callable[[str], Awaitable[T]]) -> T:
        """``call(version)`` in the version the server serves, and once more after a 404
        that says the version itself is gone: the server was upgraded or downgraded behind
        the same address since the version was found, and the call is as good in the one
        it serves now. The caller never sees that 404 unless the second try gets one too."""
        try:
            return await call(await self.resource_version())
        except NotFound as exc:
            if not exc.unserved:
                raise
        return await call(await self.resource_version())  # forgotten: found again

    def _slices(self, version: str) -> Any:
        return self._resource(version, "ResourceSlice", "resourceslices")

    def _resource(self, version: str, kind: str, plural: str, namespaced: bool = False) -> Any:
        key = (version, kind)
        if key not in self._resources:
            make = create_namespaced_resource if namespaced else create_global_resource
            self._resources[key] = make(GROUP, version, kind, plural)
        return self._resources[key]

    def _forget_on_404(self) -> None:
        if self._version is not None:
            log.info("API server no longer serves resource.k8s.io/%s; looking again",
                     self._version)
        self._version = None

    async def _call(self, awaitable: Any) -> Any:
        try:
            return await awaitable
        except Exception as exc:
            failure = translate(exc)
            if isinstance(failure, NotFound) and failure.unserved:
                self._forget_on_404()
            raise failure from exc


NODES = create_global_resource("", "v1", "Node", "nodes")
NAMESPACES = create_global_resource("", "v1", "Namespace", "namespaces")
CONFIG_MAPS = create_namespaced_resource("", "v1", "ConfigMap", "configmaps")


def new_client(config: KubeConfig, timeout: float = REQUEST_TIMEOUT) -> AsyncClient:
    """The one way this process makes an API client: the per-call timeout, this driver's
    field manager, and watches paced by :class:`WatchPacing`."""
    return AsyncClient(config, timeout=httpx2.Timeout(timeout), field_manager=FIELD_MANAGER,
                       transport=_client_transport(config))


def _client_transport(config: KubeConfig) -> WatchPacing:
    """The transport httpx would make (the cluster's CA, the user's client certificate),
    under :class:`WatchPacing`: the library makes a watch the server ended anew at once."""
    single = config.get()
    verify = verify_cluster(single.cluster, single.user, single.abs_file)
    return WatchPacing(httpx2.AsyncHTTPTransport(verify=verify))


async def _guard(stream: Any, on_unserved: Any) -> AsyncIterator[Any]:
    """Iterate a lightkube list or watch, translating its failures."""
    try:
        async for item in stream:
            yield item
    except Exception as exc:
        failure = translate(exc)
        if isinstance(failure, NotFound) and failure.unserved:
            on_unserved()
        raise failure from exc


def translate(exc: BaseException) -> ApiFailure:
    """One of this module's failures for anything the client library raised; never raises."""
    if isinstance(exc, ApiFailure):
        return exc
    if isinstance(exc, ApiError):
        code = int(exc.status.code or 0)
        reason = str(exc.status.reason or "")
        message = str(exc.status.message or reason or exc)
        return _by_status(code, message, reason, retry_after=_retry_after(exc))
    if isinstance(exc, httpx2.HTTPStatusError):
        # Not a Status object: a path the server does not serve ("404 page not found"),
        # an overload answer in plain text (429 with Retry-After), or a watch's answer,
        # whose body the library closed unread.
        response = exc.response
        status = _status_object(response)
        if status is not None:  # a Status after all, under another content type
            return _by_status(response.status_code, str(status.get("message", "")),
                              str(status.get("reason", "")), retry_after=_retry_after(exc))
        text = _text(response).strip()[:300]
        return _by_status(response.status_code, text or response.reason_phrase, "",
                          unserved=response.status_code == 404,
                          retry_after=_retry_after(exc))
    if isinstance(exc, httpx2.TimeoutException):
        return ApiUnavailable(f"API server did not answer in time ({type(exc).__name__})")
    if isinstance(exc, (httpx2.TransportError, OSError)):
        return ApiUnavailable(f"API server unreachable: {exc or type(exc).__name__}")
    return ApiUnavailable(f"API server call failed: {type(exc).__name__}: {exc}")


def _by_status(code: int, message: str, reason: str, unserved: bool = False,
               retry_after: float | None = None) -> ApiFailure:
    if code == 404:
        return NotFound(message, unserved=unserved)
    if code == 409:
        return Conflict(message, code)
    if code == 410:
        return Gone(message, code)
    text = f"{code} {reason}: {message}".replace(" :", ":")
    if code in (400, 401, 403, 422):
        return ApiRefused(text, code)
    return ApiUnavailable(text, code, retry_after)


def _status_object(response: httpx2.Response) -> dict[str, Any] | None:
    try:
        body = response.json()
    except (ValueError, httpx2.StreamError):  # not JSON, or a stream closed unread
        return None
    return body if isinstance(body, dict) and body.get("kind") == "Status" else None


def _text(response: httpx2.Response) -> str:
    try:
        return response.text
    except httpx2.StreamError:
        return ""


def _retry_after(exc: httpx2.HTTPStatusError) -> float | None:
    """``Retry-After`` in seconds (the API server only ever sends seconds)."""
    response = getattr(exc, "response", None)
    value = response.headers.get("Retry-After") if response is not None else None
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 <= seconds < 3600 else None


def _plain(obj: Any) -> dict[str, Any]:
    return obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)


def _versioned(obj: dict[str, Any], version: str) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{version}", **obj}


__all__: Sequence[str] = (
    "BACKOFF_INITIAL", "BACKOFF_MAX", "NODES", "ApiFailure", "ApiRefused", "ApiServer",
    "ApiUnavailable", "Conflict", "Gone", "NoResourceApi", "NotFound", "load_config", "new_client",
    "retry_pause", "translate",
)
