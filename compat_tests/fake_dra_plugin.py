"""A tiny DRA driver's kubelet plugin, for testing the emulated kubelet DRA manager itself.

It serves ``pluginregistration.Registration`` on a socket in ``plugins_registry`` and the DRA
services it is told to (v1, v1beta1, 1.31's v1alpha4, health) either on that same socket
(``PluginInfo.endpoint`` empty) or on a socket of its own. It answers claims from a table,
can leave claims out of the response map or fail the whole call, streams the health
messages a test queues, and records every path the kubelet called and every registration
status it was sent, so a test asserts on what went over the wire.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from api_versions import dra_services
from api_versions.dra_services import DRA_PLUGIN_TYPE, DraService
from api_versions.wire import WireApi, rpc_handler

if TYPE_CHECKING:
    from compat_tests.kubelet import KubeletEmulator

ALL_PLUGIN_SERVICES = (dra_services.V1, dra_services.V1BETA1, dra_services.V1ALPHA4)


@dataclass(frozen=True)
class FakeDevice:
    pool: str
    device: str
    requests: tuple[str, ...] = ()
    cdi_ids: tuple[str, ...] = ()
    share_id: str | None = None


@dataclass
class FakeDraPlugin:
    """One plugin instance of DRA driver ``driver``."""

    registry: Path
    driver: str = "fpga.example.com"
    supported_versions: tuple[str, ...] = dra_services.SUPPORTED_VERSIONS
    serves: tuple[DraService, ...] = ALL_PLUGIN_SERVICES
    health: bool = True
    """Serve DRAResourceHealth; without it the kubelet's health stream gets UNIMPLEMENTED."""
    health_services: tuple[DraService, ...] = dra_services.HEALTH_SERVICES
    """Which health services to serve (v1 and v1alpha1 by default), when ``health``."""
    endpoint: Path | None = None
    """Serve DRA on this socket and name it in PluginInfo; None: the registration socket."""
    bind_endpoint: bool = True
    """False: name ``endpoint`` in PluginInfo without serving it (another instance's socket)."""
    socket_name: str | None = None
    devices: dict[str, tuple[FakeDevice, ...]] = field(default_factory=dict)
    """Claim UID -> devices prepared for it (unknown UIDs get no devices)."""
    claim_errors: dict[str, str] = field(default_factory=dict)
    omit: set[str] = field(default_factory=set)
    """Claim UIDs left out of the next response maps (the kubelet must call again)."""
    abort: grpc.StatusCode | None = None
    """Fail every prepare/unprepare call with this code."""

    def __post_init__(self) -> None:
        self.socket_path = self.registry / (self.socket_name or f"{self.driver}-reg.sock")
        self.wires = {s.name: s.load() for s in self.serves}
        self.reg_wire = WireApi.load("pluginregistration")
        self.info_calls = 0
        self.statuses: list[tuple[bool, str]] = []
        self.calls: list[tuple[str, tuple[str, ...]]] = []
        """(gRPC path, claim UIDs) of every prepare/unprepare call."""
        self.claims_seen: list[tuple[str, str, str]] = []
        self.health_streams = 0
        self.health_paths: list[str] = []
        """The gRPC path of every health stream the kubelet opened."""
        self.health_queue: asyncio.Queue[Any] = asyncio.Queue()
        self._server: grpc.aio.Server | None = None

    # -- life cycle -----------------------------------------------------------------------------

    async def start(self) -> FakeDraPlugin:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers(self._handlers())
        if self.endpoint is not None and self.bind_endpoint:
            self.endpoint.parent.mkdir(parents=True, exist_ok=True)
            server.add_insecure_port(f"unix:{self.endpoint}")
        server.add_insecure_port(f"unix:{self.socket_path}")
        await server.start()
        self._server = server
        return self

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(0)
        self.socket_path.unlink(missing_ok=True)
        if self.endpoint is not None and self.bind_endpoint:
            self.endpoint.unlink(missing_ok=True)

    def remove_registration_socket(self) -> None:
        """What a stopping driver does first: the kubelet deregisters it at its next look."""
        self.socket_path.unlink(missing_ok=True)

    # -- what the kubelet may call --------------------------------------------------------------

    def _handlers(self) -> list[grpc.GenericRpcHandler]:
        reg = self.reg_wire.methods("Registration")
        handlers = [grpc.method_handlers_generic_handler("pluginregistration.Registration", {
            "GetInfo": rpc_handler(reg["GetInfo"], self._get_info),
            "NotifyRegistrationStatus": rpc_handler(reg["NotifyRegistrationStatus"],
                                                    self._notify),
        })]
        for service in self.serves:
            methods = service.methods()
            full_name = f"{service.load().package}.{service.service}"
            handlers.append(grpc.method_handlers_generic_handler(full_name, {
                "NodePrepareResources": rpc_handler(
                    methods["NodePrepareResources"], self._prepare_for(service)),
                "NodeUnprepareResources": rpc_handler(
                    methods["NodeUnprepareResources"], self._unprepare_for(service)),
            }))
        for health in self.health_services if self.health else ():
            handlers.append(grpc.method_handlers_generic_handler(
                f"{health.load().package}.{health.service}",
                {"NodeWatchResources": rpc_handler(health.methods()["NodeWatchResources"],
                                                   self._watch_for(health))}))
        return handlers

    async def _get_info(self, _request: Any, _context: grpc.aio.ServicerContext) -> Any:
        self.info_calls += 1
        return self.reg_wire.new(
            "PluginInfo", type=DRA_PLUGIN_TYPE, name=self.driver,
            endpoint=str(self.endpoint) if self.endpoint is not None else "",
            supported_versions=list(self.supported_versions))

    async def _notify(self, request: Any, _context: grpc.aio.ServicerContext) -> Any:
        self.statuses.append((bool(request.plugin_registered), str(request.error)))
        return self.reg_wire.new("RegistrationStatusResponse")

    def _prepare_for(self, service: DraService) -> Any:
        wire = self.wires[service.name]
        path = service.methods()["NodePrepareResources"].path

        async def prepare(request: Any, context: grpc.aio.ServicerContext) -> Any:
            uids = self._seen(path, request)
            if self.abort is not None:
                await context.abort(self.abort, "fake driver refuses the call")
            response = wire.new("NodePrepareResourcesResponse")
            for uid in uids:
                if uid in self.omit:
                    continue
                entry = response.claims[uid]
                if uid in self.claim_errors:
                    entry.error = self.claim_errors[uid]
                    continue
                for device in self.devices.get(uid, ()):
                    fields: dict[str, Any] = {
                        "request_names": list(device.requests), "pool_name": device.pool,
                        "device_name": device.device, "cdi_device_ids": list(device.cdi_ids)}
                    if device.share_id is not None and service is dra_services.V1:
                        fields["share_id"] = device.share_id
                    entry.devices.add(**fields)
            return response

        return prepare

    def _unprepare_for(self, service: DraService) -> Any:
        wire = self.wires[service.name]
        path = service.methods()["NodeUnprepareResources"].path

        async def unprepare(request: Any, context: grpc.aio.ServicerContext) -> Any:
            uids = self._seen(path, request)
            if self.abort is not None:
                await context.abort(self.abort, "fake driver refuses the call")
            response = wire.new("NodeUnprepareResourcesResponse")
            for uid in uids:
                if uid not in self.omit:
                    response.claims[uid].error = self.claim_errors.get(uid, "")
            return response

        return unprepare

    def _seen(self, path: str, request: Any) -> tuple[str, ...]:
        uids = tuple(c.uid for c in request.claims)
        self.calls.append((path, uids))
        self.claims_seen.extend((c.namespace, c.uid, c.name) for c in request.claims)
        return uids

    def _watch_for(self, service: DraService) -> Any:
        wire = service.load()
        path = service.methods()["NodeWatchResources"].path

        async def watch(_request: Any, _context: grpc.aio.ServicerContext
                        ) -> AsyncIterator[Any]:
            """Stream what tests queue with :meth:`send_health`; ``None`` ends the stream."""
            self.health_streams += 1
            self.health_paths.append(path)
            while True:
                devices = await self.health_queue.get()
                if devices is None:
                    return
                yield wire.new("NodeWatchResourcesResponse", devices=devices)

        return watch

    def send_health(self, *devices: dict[str, Any]) -> None:
        """Queue one NodeWatchResourcesResponse (DeviceHealth dicts) for the open stream."""
        self.health_queue.put_nowait(list(devices))

    def end_health_stream(self) -> None:
        self.health_queue.put_nowait(None)


async def registered(kubelet: KubeletEmulator, plugin: FakeDraPlugin, count: int = 1,
                     timeout: float = 5.0) -> tuple[bool, str]:
    """Wait until ``plugin`` has been sent ``count`` registration statuses; the last one."""
    await kubelet.wait_until(lambda: len(plugin.statuses) >= count, timeout,
                             f"{count} registration status(es) sent to {plugin.driver}")
    return plugin.statuses[count - 1]
