"""A kubelet's device-plugin manager (and DRA manager), emulated for one version at a time.

Tests and the demo run the real plugin against this instead of a real kubelet.
It does what a kubelet does to a plugin, in the order a kubelet does it: wipe the
directory at start, serve ``kubelet.sock`` with its own generation only, check Register,
dial back (synchronously for 1.26+), keep one ListAndWatch stream per resource, and call
Allocate / GetPreferredAllocation / PreStartContainer on demand. Version differences come
from ``models``; wire shapes from ``translate``. With DRA (1.31+, gate on: by default from
1.34) it also runs the DRA manager of ``dra.py``, reached through the plugin watcher.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable, Coroutine
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc

from api_versions.wire import WireApi
from compat_tests.kubelet import translate
from compat_tests.kubelet.admission import PodAdmission
from compat_tests.kubelet.clients import Clients, rules_for, without_devices
from compat_tests.kubelet.directory import SHARED_DIRECTORIES, clean_directory, endpoint_path
from compat_tests.kubelet.dra import DRA_PLUGIN_TYPE, DraConfig, DraManager, dra_gate
from compat_tests.kubelet.endpoint import PluginEndpoint, go_status
from compat_tests.kubelet.models import DEFAULT_MODEL, OptionsSource, load_model
from compat_tests.kubelet.podresources import (
    NodePods,
    PodResourcesServer,
)
from compat_tests.kubelet.registration import RegistrationRefused, RegistrationService
from compat_tests.kubelet.results import (
    EmulatedDevice,
    PluginCallError,
    RegistrationRecord,
)
from compat_tests.kubelet.watcher import (
    DEVICE_PLUGIN_TYPE,
    DevicePluginHandler,
    PluginHandler,
    PluginWatcher,
)

log = logging.getLogger(__name__)

KUBELET_SOCKET = "kubelet.sock"
DIAL_TIMEOUT = 10.0
MAX_UNIX_PATH = 107
POLL_INTERVAL = 0.1

DevicePredicate = Callable[[dict[str, EmulatedDevice]], bool]


def all_healthy(devices: dict[str, EmulatedDevice]) -> bool:
    """Default wait condition: the resource has devices and every one is healthy."""
    return bool(devices) and all(d.healthy for d in devices.values())


class KubeletEmulator(PodAdmission):
    """One kubelet of version ``model`` watching ``directory`` for device plugins."""

    def __init__(
        self,
        directory: Path,
        model: str = DEFAULT_MODEL,
        *,
        accept_no_version: bool = False,
        hang_register: bool = False,
        dial_timeout: float = DIAL_TIMEOUT,
        wipe_at_start: bool = True,
        plugins_registry: Path | None = None,
        reconcile_period: float = 1.0,
        refuse_watcher: Callable[[str], str | None] | None = None,
        dra: DraConfig | None = None,
        pod_resources_socket: Path | None = None,
        hang_pod_resources: bool = False,
    ) -> None:
        self.directory = Path(directory)
        self.pod_resources_socket = Path(pod_resources_socket) if pod_resources_socket else None
        """Where the PodResources API is served (1.20+); None: not served."""
        self.hang_pod_resources = hang_pod_resources
        self.pods = NodePods(self.directory)
        """The containers running on the node: they outlive this kubelet (an upgrade in
        place), so the next kubelet on the same directory reports them too."""
        self.pod_resources: PodResourcesServer | None = None
        self.plugins_registry = Path(plugins_registry) if plugins_registry else None
        """The plugin watcher's directory; None: a node without one (or a kubelet before
        1.13, which does not watch it)."""
        self.reconcile_period = reconcile_period
        self.refuse_watcher = refuse_watcher
        self.watcher: PluginWatcher | None = None
        self.dra_config = dra if dra is not None else DraConfig()
        """DRA gates and hooks; pass the same object to the next kubelet to keep its checkpoint."""
        self.dra: DraManager | None = None
        """The DRA manager while running, if the release (1.31+) and the DRA gate allow."""
        self.model = load_model(model)
        self.dra_enabled = dra_gate(self.model.name, self.dra_config)
        self.wire = WireApi.load(self.model.generation)
        self.dial_timeout = dial_timeout
        self.wipe_at_start = wipe_at_start
        self.registrations: list[RegistrationRecord] = []
        self.register_attempts: list[RegistrationRecord] = []
        self.removed_at_start: list[str] = []
        self._service = RegistrationService(
            self.model, self.wire, self._accept, self._refuse,
            accept_no_version=accept_no_version, hang=hang_register, on_call=self._notify,
        )
        self.clients = Clients(rules_for(self.model.minor))
        self._endpoints: dict[str, PluginEndpoint] = self.clients.current
        self._devices: dict[str, dict[str, EmulatedDevice]] = {}
        self._lists: dict[str, list[list[str]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Event()
        self._server: grpc.aio.Server | None = None
        if os.path.realpath(self.directory) in SHARED_DIRECTORIES:
            raise ValueError(f"{self.directory} is a shared directory; a kubelet would wipe it")
        if len(str(self.socket_path)) > MAX_UNIX_PATH:
            raise ValueError(f"{self.socket_path} is longer than a unix socket path may be")

    @property
    def generation(self) -> str:
        return self.model.generation

    @property
    def socket_path(self) -> Path:
        return self.directory / KUBELET_SOCKET

    @property
    def register_calls(self) -> int:
        """Register calls received, answered or not (a hanging kubelet answers none)."""
        return self._service.calls

    def hold_register(self) -> None:
        """Answer no Register from now on until :meth:`release_register`."""
        self._service.hold_answers()

    def release_register(self) -> None:
        self._service.release_answers()

    @property
    def running(self) -> bool:
        return self._server is not None

    # -- life cycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Start like a kubelet: make the dir, wipe plugin sockets, serve kubelet.sock.

        With ``wipe_at_start=False`` the plugin sockets are left alone, as a kubelet whose
        clean-up failed or that spares sockets would: the plugin must then notice the new
        ``kubelet.sock`` itself. A stale ``kubelet.sock`` is replaced, as every kubelet does.
        """
        if self._server is not None:
            raise RuntimeError("emulated kubelet already running")
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.wipe_at_start:
            self.removed_at_start = clean_directory(self.directory)
        else:
            self.removed_at_start = []
            self.socket_path.unlink(missing_ok=True)
        server = grpc.aio.server()
        server.add_generic_rpc_handlers(self._service.handlers())
        server.add_insecure_port(f"unix:{self.socket_path}")
        await server.start()
        self._server = server
        handlers: dict[str, PluginHandler] = {
            DEVICE_PLUGIN_TYPE: DevicePluginHandler(self, self.refuse_watcher)}
        if self.dra_enabled:
            self.dra = DraManager(self.model.name, self.dra_config)
            await self.dra.start()
            handlers[DRA_PLUGIN_TYPE] = self.dra
        if self.pod_resources_socket is not None and \
                PodResourcesServer.served_by(self.model.minor):
            self.pod_resources = PodResourcesServer(
                self.model.minor, self.pod_resources_socket, self.pods,
                dra_enabled=self.dra_enabled, hang=self.hang_pod_resources,
                allocatable=lambda: {name: sorted(i for i, d in devices.items() if d.healthy)
                                     for name, devices in self._devices.items()})
            await self.pod_resources.start()
        if self.plugins_registry is not None and self.model.watches_plugins_registry:
            self.plugins_registry.mkdir(parents=True, exist_ok=True)
            self.watcher = PluginWatcher(self, self.plugins_registry, self.reconcile_period,
                                         handlers)
            self._spawn(self.watcher.run())
        log.info(
            "kubelet %s (%s) serving %s; removed at start: %s", self.model.name,
            self.generation, self.socket_path, ", ".join(self.removed_at_start) or "nothing",
        )

    async def stop(self) -> None:
        """Stop like a kubelet going down: drop the server and streams, remove kubelet.sock."""
        if await self._go_down():
            log.info("kubelet %s stopped", self.model.name)
        self.socket_path.unlink(missing_ok=True)

    async def crash(self) -> None:
        """Go down like a kubelet killed with SIGKILL: connections drop, ``kubelet.sock`` stays.

        Nothing is said to the plugins, and the socket file is left behind with nobody
        listening on it, so a plugin registering against it gets "connection refused".
        """
        if await self._go_down():
            self.socket_path.unlink(missing_ok=True)  # gRPC removes it; put a dead one back
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
                dead.bind(str(self.socket_path))
            log.info("kubelet %s crashed; %s left behind", self.model.name, self.socket_path)

    async def _go_down(self) -> bool:
        """Drop the server, the streams and the devices; whether the kubelet was running."""
        server, self._server = self._server, None
        if server is not None:
            await server.stop(0)
        for task in list(self._tasks):
            task.cancel()
        endpoints = self.clients.clear()
        self._devices.clear()
        for endpoint in endpoints:
            await endpoint.close()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        dra, self.dra = self.dra, None
        if dra is not None:
            await dra.stop()
        pod_resources, self.pod_resources = self.pod_resources, None
        if pod_resources is not None:
            await pod_resources.stop()
        self._notify()
        return server is not None

    async def __aenter__(self) -> KubeletEmulator:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # -- registration -----------------------------------------------------------------------

    def _refuse(self, fields: translate.RegisterFields, problem: str) -> None:
        self.register_attempts.append(self._record(fields, problem))
        self._notify()

    def _record(self, fields: translate.RegisterFields, problem: str | None) -> RegistrationRecord:
        return RegistrationRecord(
            resource_name=fields.resource_name, endpoint=fields.endpoint,
            version=fields.version, generation=self.generation,
            accepted=problem is None, error=problem,
        )

    def _accepted(self, fields: translate.RegisterFields) -> None:
        record = self._record(fields, None)
        self.register_attempts.append(record)
        self.registrations.append(record)
        log.info(
            "kubelet %s: registered %s (version %s) at %s",
            self.model.name, fields.resource_name, fields.version, fields.endpoint,
        )
        self._notify()

    async def _accept(self, fields: translate.RegisterFields) -> None:
        """A Register passed the checks: dial back now (1.26+) or after answering (older)."""
        endpoint = PluginEndpoint(
            self.model, self.wire, fields.resource_name,
            endpoint_path(self.directory, fields.endpoint),
        )
        if not self.model.registers_synchronously:
            if self.model.options_source is OptionsSource.REGISTER_REQUEST:
                endpoint.options = fields.options
            self._accepted(fields)
            self._spawn(self._connect_later(endpoint))
            return
        try:
            await endpoint.dial(self.dial_timeout)
            await endpoint.fetch_options()
        except asyncio.CancelledError:  # the plugin gave up on Register, or we are stopping
            await endpoint.close()
            raise
        except PluginCallError as exc:
            await endpoint.close()
            if exc.method == "dial":
                raise RegistrationRefused(exc.details) from None
            raise RegistrationRefused(
                f"failed to get device plugin options: {go_status(exc.code, exc.details)}"
            ) from None
        self._accepted(fields)
        await self._install(endpoint)

    async def _connect_later(self, endpoint: PluginEndpoint) -> None:
        try:
            await endpoint.dial(self.dial_timeout)
        except PluginCallError as exc:
            log.error("kubelet %s: failed to dial %s: %s", self.model.name, endpoint, exc.details)
            await endpoint.close()
            return
        await self._install(endpoint)

    async def _install(self, endpoint: PluginEndpoint) -> None:
        """Make ``endpoint`` the resource's plugin (newest wins; see ``clients`` for what
        becomes of the old one) and open its stream."""
        old = self.clients.install(endpoint)
        endpoint.start_stream(self._on_update, self._on_stream_end)
        if old is not None:
            log.info("kubelet %s: %s replaces %s", self.model.name, endpoint, old)
            await old.close()

    # -- the plugin watcher's registrations ----------------------------------------------------

    async def watcher_plugin_registered(self, endpoint: PluginEndpoint,
                                        versions: list[str]) -> None:
        """The device manager's RegisterPlugin: the endpoint becomes the resource's plugin."""
        record = RegistrationRecord(
            resource_name=endpoint.resource_name, endpoint=str(endpoint.socket_path),
            version=",".join(versions), generation=self.generation, channel="plugin-watcher")
        self.register_attempts.append(record)
        self.registrations.append(record)
        log.info("kubelet %s: registered %s through the plugin watcher at %s",
                 self.model.name, endpoint.resource_name, endpoint.socket_path)
        await self._install(endpoint)
        self._notify()

    def watcher_plugin_gone(self, resource_name: str) -> None:
        """DeRegisterPlugin: the resource's live endpoint goes, whichever channel it came by
        (seen on 1.24 and 1.32: never register one resource through both)."""
        endpoint = self._endpoints.get(resource_name)
        if endpoint is not None:
            self._spawn(endpoint.close())

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- ListAndWatch -----------------------------------------------------------------------

    def _on_update(self, endpoint: PluginEndpoint, devices: dict[str, EmulatedDevice]) -> None:
        if not self.clients.feeds(endpoint, devices):
            return
        self._devices[endpoint.resource_name] = devices
        self._lists.setdefault(endpoint.resource_name, []).append(sorted(devices))
        log.info(
            "kubelet %s: %s devices: %s", self.model.name, endpoint.resource_name,
            " ".join(f"{d.id}={d.health}" + (f"@numa{list(d.numa_nodes)}" if d.numa_nodes else "")
                     for d in devices.values()) or "none",
        )
        self._notify()

    def _on_stream_end(self, endpoint: PluginEndpoint, reason: str) -> None:
        name = endpoint.resource_name
        devices_go, disconnected = self.clients.ended(endpoint)
        for gone in (endpoint, disconnected):  # the kubelet's Disconnect closes its connection
            if gone is not None and not gone.closed:
                self._spawn(gone.close())
        if not devices_go:
            return
        self._devices, outcome = without_devices(self._devices, name, self.model.table.stream_end)
        log.warning("kubelet %s: ListAndWatch of %s ended (%s)%s; %s, waiting for a new "
                    "registration", self.model.name, name, reason,
                    f", disconnecting the newer {disconnected}" if disconnected else "", outcome)
        self._notify()

    def _notify(self) -> None:
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    # -- what tests look at -----------------------------------------------------------------

    def devices(self, resource_name: str) -> dict[str, EmulatedDevice]:
        """The latest device list the kubelet holds for ``resource_name`` (a copy)."""
        return dict(self._devices.get(resource_name, {}))

    def lists_received(self, resource_name: str) -> list[list[str]]:
        """The device IDs of every ListAndWatch list taken for ``resource_name``, in order.

        :meth:`devices` only holds the latest list; a test that must show a device was never
        dropped, not even for one update (a remove and add the kubelet would act on), reads
        them all here.
        """
        return [list(ids) for ids in self._lists.get(resource_name, [])]

    def is_connected(self, resource_name: str) -> bool:
        """Whether a plugin is registered and streaming for ``resource_name``."""
        return resource_name in self._endpoints

    def endpoint_socket(self, resource_name: str) -> Path | None:
        endpoint = self._endpoints.get(resource_name)
        return endpoint.socket_path if endpoint else None

    def options(self, resource_name: str) -> translate.PluginOptions:
        return self._endpoint(resource_name).options

    async def wait_until(
        self, condition: Callable[[], bool], timeout: float = 5.0, what: str = "condition"
    ) -> None:
        """Wait (event-driven) until ``condition()`` holds; TimeoutError naming ``what``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not condition():
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"kubelet {self.model.name}: no {what} within {timeout} s")
            # Woken by every change the kubelet sees; the short cap also notices outside
            # state a caller's condition may read (a fake plugin's counters, say).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(remaining, POLL_INTERVAL))

    async def wait_for_registrations(self, count: int = 1, timeout: float = 5.0) -> None:
        await self.wait_until(
            lambda: len(self.registrations) >= count, timeout, f"{count} registration(s)"
        )

    async def wait_for_devices(
        self,
        resource_name: str,
        predicate: DevicePredicate | None = None,
        timeout: float = 5.0,
    ) -> dict[str, EmulatedDevice]:
        """Wait until the device list of ``resource_name`` satisfies ``predicate``.

        The default predicate is "at least one device and all healthy". On timeout the
        error shows the list the kubelet holds, so a failing test says what it saw.
        """
        check = predicate or all_healthy
        try:
            await self.wait_until(
                lambda: check(self.devices(resource_name)), timeout,
                f"matching devices for {resource_name}",
            )
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; holding {self.devices(resource_name)}") from None
        return self.devices(resource_name)
