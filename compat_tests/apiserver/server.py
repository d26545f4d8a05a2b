"""``ApiServerEmulator``: an emulated kube-apiserver for the resource.k8s.io parts of DRA.

It listens on 127.0.0.1 only (an ephemeral port unless told), optionally over TLS with a CA made
at start, and keeps its objects across an emulated outage the way an API server restart keeps
etcd. Tests drive it in-process through the methods below, or from another process through the
control API (control.py), which can also listen on a port of its own that stays up while the API
port is down.
"""

from __future__ import annotations

import asyncio
import copy
import secrets
import tempfile
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from compat_tests.apiserver import objects, pipeline, strategy
from compat_tests.apiserver import tls as tls_files
from compat_tests.apiserver.core_objects import CoreObjects
from compat_tests.apiserver.events import EventStore
from compat_tests.apiserver.faults import DEFAULT_USER, Faults, LoggedRequest, Tokens
from compat_tests.apiserver.http_api import handle
from compat_tests.apiserver.models import DEFAULT_MODEL, ServerModel, load_model
from compat_tests.apiserver.nodes import NodeWrites
from compat_tests.apiserver.registry import Registry
from compat_tests.apiserver.store import Store

Obj = dict[str, Any]
LOOPBACK = "127.0.0.1"


class ApiServerEmulator:
    """One emulated API server; ``async with ApiServerEmulator("1.36") as api: ...``."""

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        runtime_config: str | Mapping[str, bool] | None = None,
        feature_gates: str | Mapping[str, bool] | None = None,
        port: int = 0,
        tls: bool = False,
        tls_dir: Path | None = None,
        tokens: Mapping[str, str] | Iterable[str] | None = None,
        default_field_validation: str = "Strict",
        watch_window: int = 1000,
        bookmark_interval: float = 60.0,
        control_port: int | None = None,
    ) -> None:
        self.model: ServerModel = load_model(model, runtime_config, feature_gates)
        self.store = Store(window=watch_window)
        self.namespaces = {"default", "kube-system"}
        self.registry = Registry(self.store, lambda: self.model, self.namespaces)
        self.events = EventStore(self.store, self.namespaces)
        self.nodes = NodeWrites(self.store)
        self.core = CoreObjects(self.namespaces)
        """Namespaces (their labels) and ConfigMaps, read by ``get`` (core_objects.py)."""
        self.faults = Faults()
        self.tokens = Tokens(tokens if tokens is not None else {
            secrets.token_hex(16): DEFAULT_USER})
        self.requests: list[LoggedRequest] = []
        self.default_field_validation = default_field_validation
        self.bookmark_interval = bookmark_interval
        self.port = port
        self._tls_requested = tls or tls_dir is not None
        self._tls_dir = tls_dir
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.tls: tls_files.TlsFiles | None = None
        self._runner: web.AppRunner | None = None
        self._control_port = control_port
        self._control_runner: web.AppRunner | None = None
        self._transports: set[asyncio.Transport] = set()
        self._comeback: asyncio.Task[None] | None = None

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self) -> ApiServerEmulator:
        if self._tls_requested and self.tls is None:
            directory = self._tls_dir
            if directory is None:
                self._tmp = tempfile.TemporaryDirectory(prefix="apiserver-tls-")
                directory = Path(self._tmp.name)
            self.tls = tls_files.make(Path(directory))
        await self.come_back()
        if self._control_port is not None:
            from compat_tests.apiserver.control import control_app

            self._control_runner = web.AppRunner(control_app(self), handle_signals=False,
                                                 shutdown_timeout=0.1)
            await self._control_runner.setup()
            site = web.TCPSite(self._control_runner, LOOPBACK, self._control_port,
                               reuse_address=True)
            await site.start()
            self._control_port = _bound_port(self._control_runner)
        return self

    async def stop(self) -> None:
        if self._comeback is not None:
            self._comeback.cancel()
            self._comeback = None
        await self.go_down()
        if self._control_runner is not None:
            await self._control_runner.cleanup()
            self._control_runner = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    async def __aenter__(self) -> ApiServerEmulator:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _make_app(self) -> web.Application:
        from compat_tests.apiserver.control import PREFIX, add_control_routes

        async def entry(request: web.Request) -> web.StreamResponse:
            transport = request.transport
            if transport is not None:
                self._transports.add(transport)  # type: ignore[arg-type]
            try:
                return await handle(self, request)
            finally:
                if transport is not None:
                    self._transports.discard(transport)  # type: ignore[arg-type]

        app = web.Application(client_max_size=16 * 1024 * 1024)
        add_control_routes(app, self, PREFIX)
        app.router.add_route("*", "/{tail:.*}", entry)
        return app

    @property
    def is_up(self) -> bool:
        return self._runner is not None

    async def go_down(self) -> None:
        """Stop listening (new connections are refused) and cut every open connection."""
        if self._runner is None:
            return
        for watcher in list(self.store.watchers):
            self.store.unwatch(watcher)
        for transport in list(self._transports):
            transport.abort()
        self._transports.clear()
        runner, self._runner = self._runner, None
        await runner.cleanup()

    async def come_back(self) -> None:
        """Listen again on the same port, with the stored objects as they were."""
        if self._runner is not None:
            return
        runner = web.AppRunner(self._make_app(), handle_signals=False, access_log=None,
                               shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, LOOPBACK, self.port,
                           ssl_context=self.tls.server_context() if self.tls else None,
                           reuse_address=True)
        await site.start()
        self._runner = runner
        self.port = _bound_port(runner)

    async def outage(self, seconds: float) -> None:
        """Down for ``seconds``, then back (returns at once; the comeback runs in the loop)."""
        await self.go_down()

        async def later() -> None:
            await asyncio.sleep(seconds)
            await self.come_back()

        self._comeback = asyncio.get_running_loop().create_task(later())

    async def restart(self, model: str | None = None, *, runtime_config: Any = None,
                      feature_gates: Any = None, down_for: float = 0.0) -> None:
        """An API server restart, optionally as another release (an upgrade) on the same port."""
        await self.go_down()
        if model is not None:
            self.switch_model(model, runtime_config=runtime_config, feature_gates=feature_gates)
        if down_for:
            await asyncio.sleep(down_for)
        await self.come_back()

    def switch_model(self, model: str, *, runtime_config: Any = None,
                     feature_gates: Any = None) -> None:
        """Serve as another release from now on (stored objects are kept)."""
        self.model = load_model(model, runtime_config, feature_gates)

    # --- addresses and credentials -------------------------------------------------------

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{LOOPBACK}:{self.port}"

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def control_url(self) -> str | None:
        if self._control_runner is None:
            return None
        return f"http://{LOOPBACK}:{self._control_port}"

    @property
    def token(self) -> str:
        return self.tokens.first

    @property
    def ca_file(self) -> Path | None:
        return self.tls.ca_cert if self.tls else None

    def set_tokens(self, tokens: Mapping[str, str] | Iterable[str]) -> None:
        """Accept only these bearer tokens from now on (token rotation)."""
        self.tokens.set(tokens)

    def kubeconfig(self, token: str | None = None) -> Obj:
        cluster: Obj = {"server": self.url}
        if self.tls:
            cluster["certificate-authority"] = str(self.tls.ca_cert)
        return {"apiVersion": "v1", "kind": "Config", "preferences": {},
                "clusters": [{"name": "emulator", "cluster": cluster}],
                "users": [{"name": "emulator", "user": {"token": token or self.token}}],
                "contexts": [{"name": "emulator",
                              "context": {"cluster": "emulator", "user": "emulator"}}],
                "current-context": "emulator"}

    def write_kubeconfig(self, path: Path, token: str | None = None) -> Path:
        path.write_text(yaml.safe_dump(self.kubeconfig(token), sort_keys=False))
        return path

    # --- faults --------------------------------------------------------------------------

    def end_watches(self) -> int:
        """End every open watch cleanly (as a server does at its timeout); how many ended."""
        return self.store.close_watches()

    def expire_resource_versions(self, revision: int | None = None) -> None:
        """Forget history up to ``revision`` (default: now): resuming before it gets 410."""
        self.store.compact(revision)

    def conflict_next(self, count: int = 1) -> None:
        """The next ``count`` updates answer 409 Conflict whatever their resourceVersion."""
        self.registry.conflicts_pending += count

    # --- request log ---------------------------------------------------------------------

    def clear_requests(self) -> None:
        self.requests.clear()

    def find_requests(self, verb: str | None = None, resource: str | None = None,
                      status: int | None = None) -> list[LoggedRequest]:
        return [r for r in self.requests if verb in (None, r.verb)
                and resource in (None, r.resource) and status in (None, r.status)]

    # --- objects -------------------------------------------------------------------------

    def create_namespace(self, name: str) -> None:
        self.namespaces.add(name)

    def create_node(self, name: str, labels: Mapping[str, str] | None = None,
                    runtime: str = objects.DEFAULT_RUNTIME) -> Obj:
        node = objects.node(name, labels, runtime)
        node["metadata"].update(uid=str(uuid.uuid4()), creationTimestamp=strategy.now())
        return self.store.commit("nodes", "ADDED", node)

    def set_node_runtime(self, name: str, runtime: str) -> Obj:
        """What a kubelet started over another container runtime writes (``nodes/status``):
        the Node's ``status.nodeInfo.containerRuntimeVersion``, seen by its watchers."""
        old = self.store.get("nodes", None, name)
        if old is None:
            raise KeyError(name)
        new = copy.deepcopy(old)
        new["status"].setdefault("nodeInfo", objects.node_info(runtime))
        new["status"]["nodeInfo"]["containerRuntimeVersion"] = runtime
        return self.store.commit("nodes", "MODIFIED", new, old)

    def label_node(self, name: str, key: str, value: str | None) -> Obj:
        """What ``kubectl label node NAME KEY=VALUE --overwrite`` (or ``KEY-`` for None)
        sends: a JSON merge patch of the Node's labels, through the HTTP write path."""
        return self.nodes.patch(name, "application/merge-patch+json",
                                {"metadata": {"labels": {key: value}}})

    def delete_node(self, name: str) -> list[str]:
        """Delete a Node; like the garbage collector, also delete the objects it owns (a
        driver's slices name their Node as owner). Returns the names of those objects."""
        node = self.store.get("nodes", None, name)
        if node is None:
            return []
        self.store.commit("nodes", "DELETED", node, node)
        uid = node["metadata"]["uid"]
        collected = []
        for resource in ("resourceslices", "resourceclaims", "deviceclasses"):
            for obj in self.store.list(resource):
                owners = obj["metadata"].get("ownerReferences") or []
                if any(ref.get("uid") == uid for ref in owners):
                    meta = obj["metadata"]
                    self.registry.delete(resource, "v1", meta["name"], meta.get("namespace"))
                    collected.append(meta["name"])
        return collected

    def create(self, obj: Obj, version: str | None = None) -> Obj:
        """Create any object through the HTTP write path (validation included); v1 result."""
        resource = _resource_of(obj)
        version = version or str(obj.get("apiVersion", "/v1")).rsplit("/", 1)[1]
        namespace = obj.get("metadata", {}).get("namespace")
        created, _ = self.registry.create(resource, version, obj, namespace)
        return self.get(resource, created["metadata"]["name"], namespace) or created

    def create_device_class(self, name: str, **kwargs: Any) -> Obj:
        return self.create(objects.device_class(name, **kwargs))

    def create_claim(self, namespace: str, name: str,
                     requests: Sequence[tuple[str, str]] | Mapping[str, str] = (("req-0", "fpga"),),
                     **kwargs: Any) -> Obj:
        self.namespaces.add(namespace)
        return self.create(objects.claim(namespace, name, requests, **kwargs))

    def set_claim_status(self, namespace: str, name: str, status: Obj) -> Obj:
        """Write ``status`` of a claim through the status subresource (validated)."""
        current = self.get("resourceclaims", name, namespace)
        if current is None:
            raise KeyError(f"resourceclaim {namespace}/{name} not found")
        current["status"] = status
        updated, _ = self.registry.update("resourceclaims", "v1", name, current, namespace,
                                          status=True)
        return updated

    def create_allocated_claim(self, namespace: str, name: str, *, driver: str, pool: str,
                               devices: Sequence[str], request: str = "req-0",
                               device_class: str = "fpga", node_name: str | None = None,
                               reserved_for: Sequence[Obj] = ()) -> Obj:
        """A claim with one request, allocated ``devices`` of ``driver``'s ``pool``."""
        self.create_claim(namespace, name, [(request, device_class)])
        status: Obj = {"allocation": objects.allocation(
            [objects.result(request, driver, pool, d) for d in devices], node_name=node_name)}
        if reserved_for:
            status["reservedFor"] = list(reserved_for)
        return self.set_claim_status(namespace, name, status)

    def get(self, resource: str, name: str, namespace: str | None = None,
            version: str = "v1") -> Obj | None:
        found = self.store.get(resource, namespace, name)
        if found is None or resource in _UNCONVERTED:
            return found
        return self.registry.read(resource, version, found)

    def list(self, resource: str, namespace: str | None = None, version: str = "v1") -> list[Obj]:
        return [self.registry.read(resource, version, o) if resource not in _UNCONVERTED else o
                for o in self.store.list(resource, namespace)]

    def delete(self, resource: str, name: str, namespace: str | None = None) -> Obj:
        return self.registry.delete(resource, "v1", name, namespace)

    def validate(self, obj: Obj, version: str | None = None) -> list[str]:
        """``pipeline.validate`` against this emulator's model."""
        return pipeline.validate(copy.deepcopy(obj), version, model=self.model.name)


_UNCONVERTED = ("nodes", "events")
"""Kinds stored as served, in their one version."""


def _resource_of(obj: Obj) -> str:
    kinds = {"ResourceSlice": "resourceslices", "ResourceClaim": "resourceclaims",
             "DeviceClass": "deviceclasses"}
    try:
        return kinds[str(obj.get("kind"))]
    except KeyError:
        raise ValueError(f"cannot create kind {obj.get('kind')!r}") from None


def _bound_port(runner: web.AppRunner) -> int:
    for site_address in runner.addresses:
        return int(site_address[1])
    raise RuntimeError("the emulator is not listening")
