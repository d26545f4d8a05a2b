"""The kubelet's plugin manager: registration through sockets in ``plugins_registry``.

What the kubelet (1.13+, ``pkg/kubelet/pluginmanager``) does with the sockets in its
``plugins_registry`` directory, in its order: find every socket (at start, then on each
reconcile; names starting with ``.`` are ignored), dial it, call ``GetInfo`` (1 s); hand it to
the handler registered for ``PluginInfo.type``, refusing types without one ("no handler
registered for plugin type"); the handler validates, then registers (the endpoint is the
socket itself when ``PluginInfo.endpoint`` is empty); then tell the plugin the outcome through
``NotifyRegistrationStatus``. A socket that disappears is deregistered from its handler. The
plugin does nothing after a kubelet restart: the new kubelet finds the socket again. A
registration that failed (GetInfo unanswered, refused, endpoint unreachable) is tried again
at later reconciles with a doubling delay from 0.5 s, as the plugin manager's
pending-operations backoff does.

Handlers, like the kubelet's: ``DevicePlugin`` goes to the device manager (only ``v1beta1``,
validated name, dialled endpoint with ListAndWatch open), ``DRAPlugin`` to the DRA manager
(``dra.py``) when the kubelet runs DRA. Error wording from k8s.io/kubernetes
``pkg/kubelet/pluginmanager/operationexecutor/operation_generator.go``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import grpc

from api_versions.wire import WireApi, client_call
from compat_tests.kubelet.endpoint import PluginEndpoint
from compat_tests.kubelet.registration import is_extended_resource_name
from compat_tests.kubelet.results import PluginCallError

if TYPE_CHECKING:
    from compat_tests.kubelet.emulator import KubeletEmulator

log = logging.getLogger(__name__)

DEVICE_PLUGIN_TYPE = "DevicePlugin"
SUPPORTED_VERSIONS = ("v1beta1",)
GET_INFO_TIMEOUT = 1.0
"""The plugin manager gives GetInfo one second."""
RETRY_INITIAL, RETRY_MAX = 0.5, 120.0

Identity = tuple[int, int, int]


def socket_identity(path: Path) -> Identity | None:
    try:
        st = path.lstat()
    except OSError:
        return None
    if not stat.S_ISSOCK(st.st_mode):
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


class PluginHandler(Protocol):
    """The kubelet's ``cache.PluginHandler``: one per plugin type. Errors are returned as the
    handler words them; the plugin manager adds its own prefix."""

    def validate(self, name: str, endpoint: str, versions: tuple[str, ...],
                 socket: str) -> str | None: ...

    async def register(self, name: str, endpoint: str, versions: tuple[str, ...],
                       socket: str) -> str | None: ...

    def deregister(self, name: str, endpoint: str) -> None: ...


@dataclass(frozen=True)
class WatcherOutcome:
    """One NotifyRegistrationStatus the plugin manager sent (or would have sent)."""

    socket: str
    type: str
    name: str
    registered: bool
    error: str


class DevicePluginHandler:
    """The device manager's handler: only v1beta1, an extended resource name, a reachable
    endpoint whose options can be read; the resource's ListAndWatch stream is then opened."""

    def __init__(self, kubelet: KubeletEmulator,
                 refuse: Callable[[str], str | None] | None = None) -> None:
        self.kubelet = kubelet
        self.refuse = refuse
        """Test hook: a reason to refuse the named resource, as a device manager could."""

    def validate(self, name: str, endpoint: str, versions: tuple[str, ...],
                 socket: str) -> str | None:
        if not is_extended_resource_name(name):
            return f"invalid name of device plugin socket: {name}"
        if not any(v in SUPPORTED_VERSIONS for v in versions):
            return (f"no compatible version in {list(versions)}; the kubelet supports "
                    f"{list(SUPPORTED_VERSIONS)}")
        refused = self.refuse(name) if self.refuse is not None else None
        return refused or None

    async def register(self, name: str, endpoint: str, versions: tuple[str, ...],
                       socket: str) -> str | None:
        plugin = PluginEndpoint(self.kubelet.model, self.kubelet.wire, name, Path(endpoint))
        try:
            await plugin.dial(self.kubelet.dial_timeout)
            await plugin.fetch_options()
        except PluginCallError as exc:
            await plugin.close()
            return exc.details
        await self.kubelet.watcher_plugin_registered(plugin, list(versions))
        return None

    def deregister(self, name: str, endpoint: str) -> None:
        self.kubelet.watcher_plugin_gone(name)


class PluginWatcher:
    """Registers the plugins whose sockets sit in ``registry`` with the handler of their type."""

    def __init__(self, kubelet: KubeletEmulator, registry: Path, reconcile_period: float,
                 handlers: dict[str, PluginHandler]) -> None:
        self.kubelet = kubelet
        self.registry = registry
        self.reconcile_period = reconcile_period
        self.handlers = handlers
        self.wire = WireApi.load("pluginregistration")
        self._seen: dict[Path, Identity] = {}
        """Sockets handled (registered or refused), by the file they were."""
        self._registered: dict[Path, tuple[PluginHandler, str, str]] = {}
        """Registered sockets: their handler, plugin name and endpoint."""
        self._retry: dict[Path, tuple[float, float]] = {}
        """Failed sockets: when to try again, and the delay after that."""
        self.get_info_calls = 0
        self.outcomes: list[WatcherOutcome] = []

    async def run(self) -> None:
        while True:
            await self.reconcile()
            await asyncio.sleep(self.reconcile_period)

    async def reconcile(self) -> None:
        present = {}
        with contextlib.suppress(OSError):
            for entry in sorted(self.registry.iterdir()):
                if entry.name.startswith("."):
                    continue  # "Ignoring file (starts with '.')"
                ident = socket_identity(entry)
                if ident is not None:
                    present[entry] = ident
        for path in list(self._seen):
            if present.get(path) != self._seen[path]:
                self._deregister(path)
        now = asyncio.get_running_loop().time()
        for path, ident in present.items():
            if path in self._seen:
                continue
            due, delay = self._retry.get(path, (now, RETRY_INITIAL))
            if now < due:
                continue
            if await self._register(path):
                self._seen[path] = ident
                self._retry.pop(path, None)
            else:
                self._retry[path] = (now + delay, min(delay * 2, RETRY_MAX))

    def _deregister(self, path: Path) -> None:
        del self._seen[path]
        self._retry.pop(path, None)
        registered = self._registered.pop(path, None)
        if registered is not None:
            handler, name, endpoint = registered
            log.info("kubelet %s: plugin socket %s is gone; deregistering %s",
                     self.kubelet.model.name, path, name)
            handler.deregister(name, endpoint)

    async def _register(self, path: Path) -> bool:
        """One registration attempt; whether it succeeded."""
        methods = self.wire.methods("Registration")
        async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
            try:
                self.get_info_calls += 1
                info = await client_call(channel, methods["GetInfo"])(
                    self.wire.new("InfoRequest"), timeout=GET_INFO_TIMEOUT)
            except grpc.aio.AioRpcError as exc:
                log.warning("kubelet %s: GetInfo at %s failed: %s", self.kubelet.model.name,
                            path, exc.code().name)
                return False
            problem, handler, endpoint = await self._hand_over(info, path)
            if problem is None and handler is not None:
                self._registered[path] = (handler, info.name, endpoint)
            self.outcomes.append(WatcherOutcome(str(path), info.type, info.name,
                                                problem is None, problem or ""))
            with contextlib.suppress(grpc.aio.AioRpcError):
                await client_call(channel, methods["NotifyRegistrationStatus"])(
                    self.wire.new("RegistrationStatus", plugin_registered=problem is None,
                                  error=problem or ""), timeout=GET_INFO_TIMEOUT)
            if problem is not None:
                log.warning("kubelet %s: %s", self.kubelet.model.name, problem)
            return problem is None

    async def _hand_over(self, info: Any, path: Path
                         ) -> tuple[str | None, PluginHandler | None, str]:
        """Validate and register with the handler of the plugin's type; the error sent back."""
        kind, name = str(info.type), str(info.name)
        endpoint = str(info.endpoint or path)
        versions = tuple(str(v) for v in info.supported_versions)
        handler = self.handlers.get(kind)
        if handler is None:
            return (f"RegisterPlugin error -- no handler registered for plugin type: {kind} "
                    f"at socket {path}", None, endpoint)
        refused = handler.validate(name, endpoint, versions, str(path))
        if refused is not None:
            return (f"RegisterPlugin error -- plugin validation failed with err: {refused}",
                    handler, endpoint)
        failed = await handler.register(name, endpoint, versions, str(path))
        if failed is not None:
            return (f"RegisterPlugin error -- plugin registration failed with err: {failed}",
                    handler, endpoint)
        return None, handler, endpoint
