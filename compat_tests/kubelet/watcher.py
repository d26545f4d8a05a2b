"""The kubelet's plugin manager, for device plugins: registration without ``kubelet.sock``.

What the kubelet (1.13+, ``pkg/kubelet/pluginmanager``) does with the sockets in its
``plugins_registry`` directory, in its order: find every socket (at start, then on each
reconcile), dial it, call ``GetInfo``; hand a ``DevicePlugin`` to the device manager, which
validates the name and the offered versions (only ``v1beta1`` is accepted this way), dials
the endpoint (the socket itself when ``endpoint`` is empty) and opens ListAndWatch; then tell
the plugin the outcome through ``NotifyRegistrationStatus``. A socket that disappears is
deregistered. The plugin does nothing after a kubelet restart: the new kubelet finds the
socket again. A registration that failed (GetInfo unanswered, validation refused, endpoint
unreachable) is tried again at later reconciles with a doubling delay from 0.5 s, as the
plugin manager's pending-operations backoff does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import stat
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

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


class PluginWatcher:
    """Registers the device plugins whose sockets sit in ``registry`` with ``kubelet``."""

    def __init__(self, kubelet: KubeletEmulator, registry: Path, reconcile_period: float,
                 refuse: Callable[[str], str | None] | None = None) -> None:
        self.kubelet = kubelet
        self.registry = registry
        self.reconcile_period = reconcile_period
        self.refuse = refuse
        """Test hook: a reason to refuse the named resource, as a device manager could."""
        self.wire = WireApi.load("pluginregistration")
        self._seen: dict[Path, Identity] = {}
        """Sockets handled (registered or refused), by the file they were."""
        self._resources: dict[Path, str] = {}
        self._retry: dict[Path, tuple[float, float]] = {}
        """Failed sockets: when to try again, and the delay after that."""
        self.get_info_calls = 0

    async def run(self) -> None:
        while True:
            await self.reconcile()
            await asyncio.sleep(self.reconcile_period)

    async def reconcile(self) -> None:
        present = {}
        with contextlib.suppress(OSError):
            for entry in sorted(self.registry.iterdir()):
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
        resource = self._resources.pop(path, None)
        if resource is not None:
            log.info("kubelet %s: plugin socket %s is gone; deregistering %s",
                     self.kubelet.model.name, path, resource)
            self.kubelet.watcher_plugin_gone(resource)

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
            problem = self._problem(info, path)
            if problem is None:
                endpoint = Path(info.endpoint or str(path))
                problem = await self._connect(info.name, endpoint, list(info.supported_versions))
            if problem is None:
                self._resources[path] = info.name
            with contextlib.suppress(grpc.aio.AioRpcError):
                await client_call(channel, methods["NotifyRegistrationStatus"])(
                    self.wire.new("RegistrationStatus", plugin_registered=problem is None,
                                  error=problem or ""), timeout=GET_INFO_TIMEOUT)
            if problem is not None:
                log.warning("kubelet %s: %s", self.kubelet.model.name, problem)
            return problem is None

    def _problem(self, info: Any, path: Path) -> str | None:
        kind, name, versions = info.type, info.name, list(info.supported_versions)
        if kind != DEVICE_PLUGIN_TYPE:
            return (f"RegisterPlugin error -- no handler registered for plugin type: {kind} "
                    f"at socket {path}")
        if not is_extended_resource_name(name):
            return f"RegisterPlugin error -- plugin validation failed with err: invalid name " \
                   f"of device plugin socket: {name}"
        if not any(v in SUPPORTED_VERSIONS for v in versions):
            return (f"RegisterPlugin error -- plugin validation failed with err: "
                    f"no compatible version in {versions}; the kubelet supports "
                    f"{list(SUPPORTED_VERSIONS)}")
        refused = self.refuse(name) if self.refuse is not None else None
        if refused:
            return f"RegisterPlugin error -- plugin validation failed with err: {refused}"
        return None

    async def _connect(self, resource: str, endpoint: Path, versions: list[str]) -> str | None:
        plugin = PluginEndpoint(self.kubelet.model, self.kubelet.wire, resource, endpoint)
        try:
            await plugin.dial(self.kubelet.dial_timeout)
            await plugin.fetch_options()
        except PluginCallError as exc:
            await plugin.close()
            return f"RegisterPlugin error -- plugin registration failed with err: {exc.details}"
        await self.kubelet.watcher_plugin_registered(plugin, versions)
        return None

