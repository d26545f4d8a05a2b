"""Wire messages of each generation <-> the emulator's plain values.

Only this module reads or builds protobuf messages for the emulator, so the differences
between generations on the wire (flat vs. per-device vs. per-container AllocateResponse,
fields that only some kubelet versions read) sit in one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.protobuf.message import Message

from api_versions.wire import WireApi
from compat_tests.kubelet.models import KubeletModel
from compat_tests.kubelet.results import (
    BadPluginResponse,
    ContainerAllocation,
    DeviceNode,
    EmulatedDevice,
    MountEntry,
)


@dataclass(frozen=True)
class PluginOptions:
    """DevicePluginOptions as far as this kubelet version knows them."""

    pre_start_required: bool = False
    preferred_allocation_available: bool = False


@dataclass(frozen=True)
class RegisterFields:
    """The fields of a RegisterRequest, whatever generation sent it."""

    version: str
    endpoint: str
    resource_name: str
    options: PluginOptions


def options_from_wire(model: KubeletModel, message: Message | None) -> PluginOptions:
    """Read DevicePluginOptions, ignoring fields this kubelet version does not know."""
    if message is None:
        return PluginOptions()
    options: Any = message
    return PluginOptions(
        pre_start_required=bool(options.pre_start_required),
        preferred_allocation_available=(
            model.calls_preferred_allocation
            and bool(getattr(options, "get_preferred_allocation_available", False))
        ),
    )


def register_fields(model: KubeletModel, request: Message) -> RegisterFields:
    req: Any = request
    has_options = model.generation == "v1beta1" and req.HasField("options")
    return RegisterFields(
        version=req.version,
        endpoint=req.endpoint,
        resource_name=req.resource_name,
        options=options_from_wire(model, req.options if has_options else None),
    )


def devices_from_wire(model: KubeletModel, response: Message) -> dict[str, EmulatedDevice]:
    """A ListAndWatch answer as the kubelet stores it (topology only where it is read)."""
    devices: dict[str, EmulatedDevice] = {}
    for device in getattr(response, "devices", ()):
        numa: tuple[int, ...] = ()
        if model.reads_topology and device.HasField("topology"):
            numa = tuple(int(node.ID) for node in device.topology.nodes)
        devices[device.ID] = EmulatedDevice(id=device.ID, health=device.health, numa_nodes=numa)
    return devices


def allocate_request(wire: WireApi, device_ids: list[str]) -> Message:
    """One container's AllocateRequest: devicesIDs (alpha) or one container request (beta)."""
    if wire.generation == "v1beta1":
        container = wire.new("ContainerAllocateRequest", devices_ids=device_ids)
        return wire.new("AllocateRequest", container_requests=[container])
    return wire.new("AllocateRequest", devicesIDs=device_ids)


def _specs(items: Any) -> list[DeviceNode]:
    return [DeviceNode(d.container_path, d.host_path, d.permissions) for d in items]


def _mounts(items: Any) -> list[MountEntry]:
    return [MountEntry(m.container_path, m.host_path, m.read_only) for m in items]


def allocation_from_wire(model: KubeletModel, response: Message) -> ContainerAllocation:
    """Normalise an AllocateResponse of any generation into one ContainerAllocation."""
    resp: Any = response
    if model.generation == "v1alpha1":
        # 1.8 merges the per-device runtime specs into the container's options.
        envs: dict[str, str] = {}
        devices: list[DeviceNode] = []
        mounts: list[MountEntry] = []
        for spec in resp.spec:
            envs.update(spec.envs)
            devices.extend(_specs(spec.devices))
            mounts.extend(_mounts(spec.mounts))
        return ContainerAllocation(envs=envs, devices=devices, mounts=mounts)
    if model.generation == "v1alpha2":
        return ContainerAllocation(
            envs=dict(resp.envs), devices=_specs(resp.devices), mounts=_mounts(resp.mounts)
        )
    if not resp.container_responses:
        raise BadPluginResponse(f"no containers return in allocation response {resp}")
    first = resp.container_responses[0]  # the kubelet reads only the first one
    return ContainerAllocation(
        envs=dict(first.envs),
        devices=_specs(first.devices),
        mounts=_mounts(first.mounts),
        annotations=dict(first.annotations),
        cdi_devices=[c.name for c in first.cdi_devices] if model.reads_cdi_devices else [],
    )


def preferred_request(
    wire: WireApi, available: list[str], must_include: list[str], size: int
) -> Message:
    container = wire.new(
        "ContainerPreferredAllocationRequest",
        available_deviceIDs=available,
        must_include_deviceIDs=must_include,
        allocation_size=size,
    )
    return wire.new("PreferredAllocationRequest", container_requests=[container])


def preferred_from_wire(response: Message) -> list[str]:
    resp: Any = response
    if not resp.container_responses:
        raise BadPluginResponse(f"no containers in preferred allocation response {resp}")
    return list(resp.container_responses[0].deviceIDs)
