"""What every generation's adapter shares: registration request, ListAndWatch, refusals.

An adapter is a pure translator between the internal model (``value_types.devices``) and one wire
generation. It holds no device state: the served resource hands it the live feed, and the
Allocate decisions come from ``plugin.model.allocation`` so every generation refuses alike.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any, ClassVar, Protocol

import grpc
from google.protobuf.message import Message
from packaging.version import Version

from api_versions.wire import Method, WireApi, rpc_handler
from api_versions.wire_values import ReportOnce, id_problem, shown_id
from value_types.allocation import AllocationError, ContainerAllocation
from value_types.devices import Device, DeviceNode, DeviceSet, Health, Mount

log = logging.getLogger(__name__)

Behaviour = Callable[[Any, grpc.aio.ServicerContext], Any]


class DeviceSource(Protocol):
    """A resource's live devices: the snapshot now, and every newer one as it comes."""

    @property
    def current(self) -> DeviceSet: ...

    def subscribe(self) -> AsyncIterator[DeviceSet]: ...


class CdiNaming(Protocol):
    """How Allocate names devices when CDI is on."""

    @property
    def device_specs(self) -> bool:
        """Whether device nodes are still sent as DeviceSpecs next to the CDI names."""
        ...

    def qualified(self, device_ids: tuple[str, ...] | list[str]) -> list[str]:
        """The fully qualified CDI names of ``device_ids``."""
        ...


class Allocator(Protocol):
    """The device logic behind ListAndWatch's IDs, Allocate and GetPreferredAllocation, owned
    by the plugin. The other calls take the real devices and the IDs as the kubelet has them."""

    def advertised(self, devices: DeviceSet) -> DeviceSet:
        """The devices as ListAndWatch lists them (with replicas, several IDs per device)."""
        ...

    def allocate(self, devices: DeviceSet, requested: Sequence[str]) -> ContainerAllocation:
        """One container's share, or :class:`AllocationError` naming what is refused."""
        ...

    def preferred(self, devices: DeviceSet, available: Sequence[str],
                  must_include: Sequence[str], size: int) -> list[str]:
        """The IDs the kubelet should pick for one container."""
        ...

    def preference_matters(self, devices: DeviceSet) -> bool:
        """Whether a preferred allocation can change anything (and so is advertised)."""
        ...

    def counted(self, resource_name: str, generation: str, granted: bool) -> None:
        """Told of every container's allocation granted or refused, for the metrics."""
        ...


class ServedResource(Protocol):
    """What an adapter needs from the plugin: a name, its live devices, and its rules."""

    @property
    def resource_name(self) -> str: ...

    @property
    def feed(self) -> DeviceSource: ...

    @property
    def allocator(self) -> Allocator: ...

    @property
    def cdi(self) -> CdiNaming | None:
        """How Allocate names devices when CDI is on; None when it is off."""
        ...


class Adapter(ABC):
    """One wire generation. Subclasses set the class constants and the generation's shapes."""

    name: ClassVar[str]
    """The generation's name in this project and in ``--api-versions``, e.g. ``"v1beta1"``."""
    register_version: ClassVar[str]
    """What ``RegisterRequest.version`` must say for this generation's kubelet."""

    def __init__(self) -> None:
        self.wire = WireApi.load(self.name)
        self._unsendable = ReportOnce(log)

    @property
    def order(self) -> Version:
        """Sort key: ``v1alpha1 < v1alpha2 < v1beta1`` by PEP 440 pre-release rules."""
        return Version(self.name)

    @property
    def register_method(self) -> Method:
        return self.wire.method("Registration", "Register")

    def register_request(self, resource: ServedResource, endpoint: str) -> Message:
        return self.wire.new(
            "RegisterRequest",
            version=self.register_version,
            endpoint=endpoint,
            resource_name=resource.resource_name,
            **self.register_extras(resource),
        )

    def register_extras(self, resource: ServedResource) -> dict[str, Any]:
        """Fields beyond version/endpoint/resource_name that this generation sends."""
        return {}

    def registration_terms(self, resource: ServedResource) -> object:
        """What the kubelet learns once, at registration, and never asks again.

        The server registers anew when this changes under a registration (for v1beta1, the
        options, which follow the devices); generations without options have none.
        """
        return None

    def handlers(self, resource: ServedResource) -> dict[str, grpc.RpcMethodHandler]:
        """gRPC handlers of this generation's DevicePlugin service, keyed by method path."""
        behaviours = self.behaviours(resource)
        methods = self.wire.methods("DevicePlugin")
        missing = set(methods) - set(behaviours)
        if missing:
            raise TypeError(f"{self.name} adapter lacks {', '.join(sorted(missing))}")
        return {
            methods[name].path: rpc_handler(methods[name], _guarded(self.name, name, fn))
            for name, fn in behaviours.items()
        }

    def behaviours(self, resource: ServedResource) -> dict[str, Behaviour]:
        async def list_and_watch(
            _request: Message, _context: grpc.aio.ServicerContext
        ) -> AsyncIterator[Message]:
            log.info("%s: kubelet opened ListAndWatch (%s)", resource.resource_name, self.name)
            async for devices in resource.feed.subscribe():
                yield self.list_response(resource.allocator.advertised(devices))

        return {"ListAndWatch": list_and_watch, "Allocate": self.allocate_behaviour(resource)}

    def list_response(self, devices: Iterable[Device]) -> Message:
        """One ListAndWatch message; no device's values can make it fail for the others.

        Each device is translated (and serialised, which is where protobuf would refuse a
        value) on its own. A device with an ID that cannot be sent is left out: any other ID
        would be one the kubelet cannot allocate. A device whose other values cannot be sent
        goes as its bare ID, Unhealthy: the plugin does not vouch for what it cannot describe.
        """
        messages = []
        for device in devices:
            message = self._sendable(device)
            if message is not None:
                messages.append(message)
        return self.wire.new("ListAndWatchResponse", devices=messages)

    def _sendable(self, device: Device) -> Message | None:
        device_id: object = getattr(device, "id", None)
        problem = id_problem(device_id)
        if problem:
            self._unsendable.report(device_id, f"{self.name}: device ID {shown_id(device_id)} "
                                    f"{problem}; leaving the device out of ListAndWatch")
            return None
        try:
            message = self.device_message(device)
            message.SerializeToString()
            return message
        except Exception as exc:
            self._unsendable.report(
                device_id, f"{self.name}: device {shown_id(device_id)} cannot be sent as it is "
                f"({type(exc).__name__}: {str(exc)[:200]}); advertising it Unhealthy")
        return self.wire.new("Device", ID=device_id, health=Health.UNHEALTHY.value)

    def device_message(self, device: Device) -> Message:
        """The generation's Device; health is always one of the two spellings kubelets know."""
        health = Health.HEALTHY if device.health is Health.HEALTHY else Health.UNHEALTHY
        return self.wire.new("Device", ID=device.id, health=health.value)

    @abstractmethod
    def allocate_behaviour(self, resource: ServedResource) -> Behaviour: ...

    def grant(self, resource: ServedResource, containers: Sequence[Sequence[str]]) -> list[
        ContainerAllocation
    ]:
        """Allocate for every container or for none: the kubelet rejects the pod on error."""
        devices = resource.feed.current
        allocator = resource.allocator
        try:
            granted = [allocator.allocate(devices, list(ids)) for ids in containers]
        except AllocationError:
            allocator.counted(resource.resource_name, self.name, granted=False)
            raise
        for _ in granted:
            allocator.counted(resource.resource_name, self.name, granted=True)
        # Logged once the answer is on its way: the kubelet waits on the answer, not the log.
        asyncio.get_running_loop().call_soon(_log_granted, resource.resource_name, granted,
                                             self.name)
        return granted

    # Shapes shared by all generations.
    def device_specs(self, nodes: Sequence[DeviceNode]) -> list[Message]:
        return [
            self.wire.new(
                "DeviceSpec",
                container_path=n.container_path,
                host_path=n.host_path,
                permissions=n.permissions,
            )
            for n in nodes
        ]

    def mounts(self, mounts: Sequence[Mount]) -> list[Message]:
        return [
            self.wire.new(
                "Mount",
                container_path=m.container_path,
                host_path=m.host_path,
                read_only=m.read_only,
            )
            for m in mounts
        ]


def _log_granted(resource_name: str, granted: list[ContainerAllocation], generation: str) -> None:
    for allocation in granted:
        log.info("%s: allocated %s (%s)", resource_name, ",".join(allocation.device_ids),
                 generation)


def _guarded(generation: str, method: str, behaviour: Behaviour) -> Behaviour:
    """Turn refusals into INVALID_ARGUMENT and bugs into INTERNAL; never let one kill a server."""

    async def unary(request: Message, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await behaviour(request, context)
        except AllocationError as exc:
            log.warning("%s %s refused: %s", generation, method, exc)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Exception as exc:
            if isinstance(exc, grpc.aio.AbortError):
                raise
            log.exception("%s %s failed", generation, method)
            await context.abort(grpc.StatusCode.INTERNAL, f"{method} failed: {exc}")

    async def streaming(request: Message, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        try:
            async for item in behaviour(request, context):
                yield item
        except Exception as exc:
            if isinstance(exc, grpc.aio.AbortError):
                raise
            log.exception("%s %s failed", generation, method)
            await context.abort(grpc.StatusCode.INTERNAL, f"{method} failed: {exc}")

    return streaming if inspect.isasyncgenfunction(behaviour) else unary

