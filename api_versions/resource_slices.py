"""ResourceSlice objects for resource.k8s.io v1, v1beta2 and v1beta1, built from a DRA pool.

The only place that knows how a slice is spelt; what the node has is decided in
:mod:`plugin.serving.dra.inventory`. The three versions differ for a node-local driver in one
way: v1beta1 wraps each device's fields in ``basic`` (k8s.io/api ``resource/v1beta1``
``Device.Basic``); v1beta2 and v1 list them on the device itself. Attributes are
``{"<qualified name>": {"string"|"int"|"bool"|"version": value}}`` and capacities
``{"<name>": {"value": "<quantity>"}}`` in all three.

The object is what the Go helper's slice controller writes (k8s.io/dynamic-resource-allocation
``resourceslice/resourceslicecontroller.go``): owned by the Node (``controller: true``, so
deleting the Node collects it), ``spec.nodeName`` set, the pool named with its generation and
the number of slices that make it up.

Limits (k8s.io/api ``resource/v1/types.go``, k/k ``validation.go``): at most 128 devices in a
slice, but 64 when any device has taints (``ResourceSliceMaxDevicesWithTaintsOrConsumesCounters``,
checked by every server that knows taints). When taints are kept, slices are cut at 64 whether
or not a device is tainted right now, so that a device turning unhealthy changes one slice's
content and never the layout of the pool; otherwise at 128. A pool with more devices is cut
into several slices, all with the same generation and ``resourceSliceCount``; a pool with none
still gets one empty slice, which tells the scheduler the driver is up and has nothing.

Shared devices (``DraDevice.shared_contexts``, KEP-5075 consumable capacity, resource.k8s.io
1.36 ``Device.allowMultipleAllocations`` and ``DeviceCapacity.requestPolicy``, in ``basic`` for
v1beta1 like every device field): ``allowMultipleAllocations: true`` and a ``contexts``
capacity of N whose policy gives a claim 1 unless it asks more, at most N. They change no
slice limit: 128 devices a slice, 64 with taints, as for any device. A server with the
DRAConsumableCapacity gate off (1.34, 1.35) drops both fields and stores the device as one
allocated whole, which is what it then is.

Unhealthy devices: a server that keeps device taints (gate DRADeviceTaints: alpha, off by
default, in 1.33 to 1.35; beta and on from 1.36) gets them with a ``NoSchedule`` taint
``<driver>/unhealthy`` whose value says why, so nothing new is allocated on them while running
pods keep them. A server without the gate drops taints silently and would offer the device as
if healthy, so there unhealthy devices are left out of the slice. Which one the server is, the
caller says (from its version and gates, or by :func:`dropped_taints` on what it stored).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from api_versions.resource_versions import api_version, check_known
from value_types.pool import CONTEXTS, AttributeKind, AttributeValue, DraDevice, Pool

KIND = "ResourceSlice"
MAX_DEVICES = 128
MAX_DEVICES_WITH_TAINTS = 64
UNHEALTHY_TAINT = "unhealthy"
IN_USE_TAINT = "in-use"
"""Key (in the driver's domain) of the taint a device carries while it is offered to no new
claim though in use (``DraDevice.held_by``, the taint's value): a container still holds it
through the device plugin after the node moved to DRA, or shares hold it and it takes no
new one."""
TAINT_EFFECT = "NoSchedule"
MAX_GENERATED_BASE = 58
"""The API server cuts a ``generateName`` to 58 characters before adding its 5 random ones
(apiserver ``names.SimpleNameGenerator``); cutting it here first keeps a long node name from
making the prefix itself an invalid name."""
WRAPPED_VERSIONS = ("v1beta1",)
"""Versions that put a device's fields under ``basic``."""

_VALUE_FIELD = {
    AttributeKind.STRING: "string",
    AttributeKind.INT: "int",
    AttributeKind.BOOL: "bool",
    AttributeKind.VERSION: "version",
}

Obj = dict[str, Any]


def taint_key(driver: str) -> str:
    """The key of the taint an unhealthy device carries: in the driver's own domain."""
    return f"{driver}/{UNHEALTHY_TAINT}"


def generate_name(pool: Pool) -> str:
    """``<node>-<driver>-``, as the Go helper (dra@v0.34) prefixes node-local slices."""
    return f"{pool.node_name}-{pool.driver}-"[:MAX_GENERATED_BASE]


def devices_per_slice(taints: bool) -> int:
    return MAX_DEVICES_WITH_TAINTS if taints else MAX_DEVICES


def slices_for(version: str, pool: Pool, generation: int, node_uid: str, taints: bool,
               *, names: Sequence[str] = ()) -> list[Obj]:
    """Every ResourceSlice of ``pool`` at ``generation``, as ``version`` spells them.

    ``taints``: the server keeps device taints; unhealthy devices, and devices still held
    through the device plugin, are then published tainted, otherwise left out. ``node_uid``
    is the Node's UID for the owner reference. ``names`` gives the slices that already exist
    their names (first slice first) so they can be updated in place; slices beyond them get
    ``generateName``. Raises ValueError for an unknown version, a negative generation or an
    empty UID.
    """
    check_known(version)
    if isinstance(generation, bool) or not isinstance(generation, int) or generation < 0:
        raise ValueError(f"pool generation must be an integer >= 0, got {generation!r}")
    if not node_uid:
        raise ValueError(f"node {pool.node_name!r}: the owner reference needs the Node's UID")
    listed = [d for d in pool.devices if (d.healthy and not d.held_by) or taints]
    limit = devices_per_slice(taints)
    chunks = [listed[i:i + limit] for i in range(0, len(listed), limit)] or [[]]
    return [_slice(version, pool, generation, node_uid, chunk, len(chunks),
                   names[index] if index < len(names) else None)
            for index, chunk in enumerate(chunks)]


def _slice(version: str, pool: Pool, generation: int, node_uid: str,
           devices: Iterable[DraDevice], count: int, name: str | None) -> Obj:
    metadata: Obj = {"name": name} if name else {"generateName": generate_name(pool)}
    metadata["ownerReferences"] = [{
        "apiVersion": "v1",
        "kind": "Node",
        "name": pool.node_name,
        "uid": node_uid,
        "controller": True,
    }]
    return {
        "apiVersion": api_version(version),
        "kind": KIND,
        "metadata": metadata,
        "spec": {
            "driver": pool.driver,
            "nodeName": pool.node_name,
            "pool": {"name": pool.name, "generation": generation, "resourceSliceCount": count},
            "devices": [device_shape(version, d, pool.driver) for d in devices],
        },
    }


def attribute_shape(value: AttributeValue) -> Obj:
    return {_VALUE_FIELD[value.kind]: value.value}


def device_shape(version: str, device: DraDevice, driver: str) -> Obj:
    """One entry of ``spec.devices``; an unhealthy device gets the unhealthy taint."""
    check_known(version)
    fields: Obj = {}
    if device.attributes:
        fields["attributes"] = {name: attribute_shape(value)
                                for name, value in device.attributes.items()}
    capacity: Obj = {name: {"value": quantity} for name, quantity in device.capacity.items()}
    if device.shared_contexts:
        fields["allowMultipleAllocations"] = True
        capacity[CONTEXTS] = contexts_capacity(device.shared_contexts)
    if capacity:
        fields["capacity"] = capacity
    taints: list[Obj] = []
    if not device.healthy:
        taint: Obj = {"key": taint_key(driver), "effect": TAINT_EFFECT}
        if device.health_code:
            taint["value"] = device.health_code
        taints.append(taint)
    if device.held_by:
        # Still in use (through the other API, or by shares): visible, with why, but
        # allocated to nobody new (the scheduler skips NoSchedule-tainted devices for
        # claims without a toleration; prepare refuses one with, or, for a share during a
        # clear, checks the function it was shared with once the clear is over).
        taints.append({"key": f"{driver}/{IN_USE_TAINT}", "value": device.held_by,
                       "effect": TAINT_EFFECT})
    if taints:
        fields["taints"] = taints
    if device.binding_conditions:  # KEP-5007, in v1, v1beta2 and v1beta1's basic alike
        fields["bindingConditions"] = list(device.binding_conditions)
        fields["bindingFailureConditions"] = list(device.binding_failure_conditions)
    if version in WRAPPED_VERSIONS:
        return {"name": device.name, "basic": fields}
    return {"name": device.name, **fields}


def contexts_capacity(contexts: int) -> Obj:
    """A shared device's ``contexts`` capacity: ``contexts`` in all, a claim that asks no
    amount takes 1, and one may ask any whole number up to all of them
    (``DeviceCapacity.requestPolicy``, KEP-5075 consumable capacity)."""
    total = str(contexts)
    return {"value": total, "requestPolicy": {
        "default": "1", "validRange": {"min": "1", "max": total, "step": "1"}}}


def device_fields(version: str, device: Mapping[str, Any]) -> Mapping[str, Any]:
    """The fields of a ``spec.devices`` entry of ``version``, wherever that version puts them."""
    check_known(version)
    if version in WRAPPED_VERSIONS:
        basic = device.get("basic")
        return basic if isinstance(basic, Mapping) else {}
    return device


def _taints_by_device(version: str, slice_obj: Mapping[str, Any]) -> dict[str, int]:
    spec = slice_obj.get("spec")
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    counts: dict[str, int] = {}
    for device in devices if isinstance(devices, list) else []:
        if isinstance(device, Mapping):
            taints = device_fields(version, device).get("taints")
            counts[str(device.get("name", ""))] = len(taints) if isinstance(taints, list) else 0
    return counts


def dropped_taints(version: str, sent: Mapping[str, Any], stored: Mapping[str, Any]) -> bool:
    """Whether the server stored fewer taints than were sent: it has DRADeviceTaints off.

    The Go helper reports the same condition as ``DroppedFieldsError``; a driver that sees it
    must publish again without the unhealthy devices, or they would be allocated.
    """
    before, after = _taints_by_device(version, sent), _taints_by_device(version, stored)
    return any(after.get(name, 0) < count for name, count in before.items())


def _devices_with(version: str, slice_obj: Mapping[str, Any],
                  has: Callable[[Mapping[str, Any]], bool]) -> set[str]:
    """Names of the slice's devices whose fields satisfy ``has``."""
    spec = slice_obj.get("spec")
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    return {str(device.get("name", "")) for device in (devices if isinstance(devices, list)
                                                       else [])
            if isinstance(device, Mapping) and has(device_fields(version, device))}


def _shared_devices(version: str, slice_obj: Mapping[str, Any]) -> set[str]:
    return _devices_with(version, slice_obj,
                         lambda fields: fields.get("allowMultipleAllocations") is True)


def dropped_sharing(version: str, sent: Mapping[str, Any], stored: Mapping[str, Any]
                    ) -> list[str]:
    """The devices sent with ``allowMultipleAllocations`` that the server stored without it:
    it has DRAConsumableCapacity off (alpha, off by default, in 1.34 and 1.35), drops the
    field on write, and its scheduler allocates those devices whole, one claim at a time."""
    return sorted(_shared_devices(version, sent) - _shared_devices(version, stored))


def _bound_devices(version: str, slice_obj: Mapping[str, Any]) -> set[str]:
    return _devices_with(version, slice_obj, lambda fields: bool(fields.get("bindingConditions")))


def dropped_binding(version: str, sent: Mapping[str, Any], stored: Mapping[str, Any]
                    ) -> list[str]:
    """The devices sent with ``bindingConditions`` that the server stored without them: it
    has DRADeviceBindingConditions (or DRAResourceClaimDeviceStatus) off, as 1.34 and 1.35
    do by default, drops the fields on write, and its scheduler binds pods without waiting:
    their functions are then loaded at prepare."""
    return sorted(_bound_devices(version, sent) - _bound_devices(version, stored))
