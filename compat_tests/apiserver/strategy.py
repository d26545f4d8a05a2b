"""What the server itself does to an object between decoding and storing it, per kind.

From k/k ``pkg/registry/resource/{resourceslice,resourceclaim,deviceclass}/strategy.go`` and
``pkg/apis/resource/v1/defaults.go``:

- defaulting: ``exactly`` and ``firstAvailable`` requests get ``allocationMode: ExactCount`` and
  ``count: 1``; a device taint without ``timeAdded`` gets the current second;
- ``metadata.generation`` is 1 on create and grows on every spec change (slices and classes);
- a claim's status is wiped on create and kept on a spec update; a status update keeps the
  spec and the labels, annotations, finalizers and owner references;
- fields behind a disabled feature gate are dropped silently, unless the stored object already
  uses them (ratcheting): DRADeviceTaints (device taints), DRAPartitionableDevices,
  DRADeviceBindingConditions (with DRAResourceClaimDeviceStatus), DRAConsumableCapacity (a
  device's ``allowMultipleAllocations`` and ``requestPolicy``; a claim request's
  ``capacity``, a result's ``shareID`` and ``consumedCapacity``, a device status's
  ``shareID``),
  DRAListTypeAttributes, DRANodeAllocatableResources, DRAExtendedResource (class
  ``extendedResourceName``), DRAPrioritizedList, DRAAdminAccess, DRAResourceClaimDeviceStatus.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from compat_tests.apiserver.models import ServerModel
from compat_tests.apiserver.rules_common import as_dict, as_list

Obj = dict[str, Any]
_LIST_ATTRS = ("bools", "ints", "strings", "versions")


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _devices(obj: Obj | None) -> list[Obj]:
    return [as_dict(d) for d in as_list(as_dict(as_dict(obj).get("spec")).get("devices"))]


def _requests(obj: Obj | None) -> list[Obj]:
    devices = as_dict(as_dict(as_dict(obj).get("spec")).get("devices"))
    return [as_dict(r) for r in as_list(devices.get("requests"))]


def apply_defaults(resource: str, obj: Obj) -> None:
    """The v1 defaulting functions (run on every write, before validation)."""
    if resource == "resourceslices":
        for device in _devices(obj):
            for taint in map(as_dict, as_list(device.get("taints"))):
                taint.setdefault("timeAdded", now())
    elif resource == "resourceclaims":
        for request in _requests(obj):
            exact = request.get("exactly")
            for target in ([exact] if isinstance(exact, dict) else []) + [
                    as_dict(s) for s in as_list(request.get("firstAvailable"))]:
                target.setdefault("allocationMode", "ExactCount")
                if target["allocationMode"] == "ExactCount" and not target.get("count"):
                    target["count"] = 1
            if isinstance(exact, dict):
                for tol in map(as_dict, as_list(exact.get("tolerations"))):
                    tol.setdefault("operator", "Equal")


GateRule = tuple[str, Callable[[Obj], bool], Callable[[Obj], None]]


def _slice_gates() -> list[GateRule]:
    """(gate, does a device use it, drop it from a device) for the per-device slice fields."""
    def keys_in(*keys: str) -> Callable[[Obj], bool]:
        return lambda d: any(k in d for k in keys)

    def drop(*keys: str) -> Callable[[Obj], None]:
        return lambda d: [d.pop(k, None) for k in keys] and None

    def uses_policy(d: Obj) -> bool:
        return "allowMultipleAllocations" in d or any(
            "requestPolicy" in as_dict(c) for c in as_dict(d.get("capacity")).values())

    def drop_policy(d: Obj) -> None:
        d.pop("allowMultipleAllocations", None)
        for capacity in as_dict(d.get("capacity")).values():
            as_dict(capacity).pop("requestPolicy", None)

    def uses_lists(d: Obj) -> bool:
        return any(k in as_dict(a) for a in as_dict(d.get("attributes")).values()
                   for k in _LIST_ATTRS)

    def drop_lists(d: Obj) -> None:
        for attribute in as_dict(d.get("attributes")).values():
            for key in _LIST_ATTRS:
                as_dict(attribute).pop(key, None)

    binding = ("bindingConditions", "bindingFailureConditions", "bindsToNode")
    return [
        ("DRADeviceTaints", lambda d: bool(d.get("taints")), drop("taints")),
        ("DRADeviceBindingConditions", keys_in(*binding), drop(*binding)),
        ("DRAConsumableCapacity", uses_policy, drop_policy),
        ("DRAListTypeAttributes", uses_lists, drop_lists),
        ("DRANodeAllocatableResources", lambda d: bool(d.get("nodeAllocatableResourceMappings")),
         drop("nodeAllocatableResourceMappings")),
    ]


def _gate_on(model: ServerModel, gate: str) -> bool:
    if gate == "DRADeviceBindingConditions":
        return model.enabled(gate) and model.enabled("DRAResourceClaimDeviceStatus")
    return model.enabled(gate)


def drop_disabled_fields(resource: str, new: Obj, old: Obj | None, model: ServerModel) -> None:
    if resource == "resourceslices":
        devices, old_devices = _devices(new), _devices(old)
        for gate, uses, drop in _slice_gates():
            if not _gate_on(model, gate) and not any(uses(d) for d in old_devices):
                for device in devices:
                    drop(device)
        partition = ("consumesCounters", "nodeName", "nodeSelector", "allNodes")
        spec, old_spec = as_dict(new.get("spec")), as_dict(as_dict(old).get("spec"))
        in_use = bool(old_spec.get("sharedCounters")) or "perDeviceNodeSelection" in old_spec or \
            any(k in d for d in old_devices for k in partition)
        if not model.enabled("DRAPartitionableDevices") and not in_use:
            spec.pop("sharedCounters", None)
            spec.pop("perDeviceNodeSelection", None)
            for device in devices:
                for key in partition:
                    device.pop(key, None)
    elif resource == "deviceclasses":
        old_name = as_dict(as_dict(old).get("spec")).get("extendedResourceName")
        if not model.enabled("DRAExtendedResource") and old_name is None:
            as_dict(new.get("spec")).pop("extendedResourceName", None)
    elif resource == "resourceclaims":
        _drop_claim_fields(new, old, model)


def _drop_claim_fields(new: Obj, old: Obj | None, model: ServerModel) -> None:
    requests, old_requests = _requests(new), _requests(old)
    if not model.enabled("DRAPrioritizedList") and not any(
            r.get("firstAvailable") for r in old_requests):
        for request in requests:
            request.pop("firstAvailable", None)
    results = as_list(as_dict(as_dict(as_dict(new.get("status")).get("allocation"))
                              .get("devices")).get("results"))
    old_results = as_list(as_dict(as_dict(as_dict(as_dict(old).get("status")).get("allocation"))
                                  .get("devices")).get("results"))
    admin_in_use = any("adminAccess" in as_dict(r.get("exactly")) for r in old_requests) or any(
        "adminAccess" in as_dict(r) for r in old_results)
    if not model.enabled("DRAAdminAccess") and not admin_in_use:
        for request in requests:
            as_dict(request.get("exactly")).pop("adminAccess", None)
        for result in map(as_dict, results):
            result.pop("adminAccess", None)
    old_devices = as_list(as_dict(as_dict(old).get("status")).get("devices"))
    if not model.enabled("DRAConsumableCapacity"):
        _drop_consumable_capacity(requests, results, new, old_requests, old_results, old_devices)
    if not model.enabled("DRAResourceClaimDeviceStatus") and not old_devices:
        as_dict(new.get("status")).pop("devices", None)


def _drop_consumable_capacity(requests: list[Obj], results: list[Any], new: Obj,
                              old_requests: list[Obj], old_results: list[Any],
                              old_devices: list[Any]) -> None:
    """KEP-5075's claim fields while the gate is off: request ``capacity``, a result's
    ``shareID`` and ``consumedCapacity``, a device status's ``shareID``; kept when the stored
    claim uses one already."""
    def targets(request: Obj) -> list[Obj]:
        exact = request.get("exactly")
        return ([exact] if isinstance(exact, dict) else []) + [
            as_dict(s) for s in as_list(request.get("firstAvailable"))]

    share_keys = ("shareID", "consumedCapacity")
    if any("capacity" in t for r in old_requests for t in targets(r)) or any(
            k in as_dict(r) for r in old_results for k in share_keys) or any(
            "shareID" in as_dict(d) for d in old_devices):
        return
    for request in requests:
        for target in targets(request):
            target.pop("capacity", None)
    for result in map(as_dict, results):
        for key in share_keys:
            result.pop(key, None)
    for device in map(as_dict, as_list(as_dict(new.get("status")).get("devices"))):
        device.pop("shareID", None)


_RAW = ("parameters", "data")  # runtime.RawExtension: kept byte for byte


def prune_empty(value: Any) -> Any:
    """Drop empty lists and maps, as storing in etcd (protobuf) and reading back does.

    Runs after validation: some rules tell an empty list from an absent one (``bools: []``
    is an error, ``devices: []`` next to ``sharedCounters`` too), storage does not.
    """
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            item = item if key in _RAW else prune_empty(item)
            if key in _RAW or item not in ([], {}):
                out[key] = item
        return out
    if isinstance(value, list):
        return [prune_empty(item) for item in value]
    return value


def _spec_changed(new: Obj, old: Obj) -> bool:
    return new.get("spec") != old.get("spec")


def prepare_create(resource: str, obj: Obj, model: ServerModel) -> None:
    meta = obj.setdefault("metadata", {})
    if resource in ("resourceslices", "deviceclasses"):
        meta["generation"] = 1
    else:
        meta.pop("generation", None)
    if resource == "resourceclaims":
        obj.pop("status", None)
    drop_disabled_fields(resource, obj, None, model)


def prepare_update(resource: str, obj: Obj, old: Obj, model: ServerModel) -> None:
    meta, old_meta = obj.setdefault("metadata", {}), as_dict(old.get("metadata"))
    if "generation" in old_meta:
        meta["generation"] = old_meta["generation"]
    else:
        meta.pop("generation", None)
    if resource == "resourceclaims":
        if "status" in old:
            obj["status"] = old["status"]
        else:
            obj.pop("status", None)
    drop_disabled_fields(resource, obj, old, model)
    if resource in ("resourceslices", "deviceclasses") and _spec_changed(obj, old):
        meta["generation"] = old_meta.get("generation", 0) + 1


def prepare_status_update(obj: Obj, old: Obj, model: ServerModel) -> None:
    """A claim status write: only ``status`` comes from the request."""
    obj["spec"] = old.get("spec")
    meta, old_meta = obj.setdefault("metadata", {}), as_dict(old.get("metadata"))
    for key in ("deletionTimestamp", "generation", "labels", "annotations", "finalizers",
                "ownerReferences"):
        if key in old_meta:
            meta[key] = old_meta[key]
        else:
            meta.pop(key, None)
    _drop_deallocated_devices(obj, old)
    drop_disabled_fields("resourceclaims", obj, old, model)


def _drop_deallocated_devices(new: Obj, old: Obj) -> None:
    def ids(obj: Obj) -> set[tuple[Any, Any, Any]]:
        results = as_list(as_dict(as_dict(as_dict(obj.get("status")).get("allocation"))
                                  .get("devices")).get("results"))
        return {(as_dict(r).get("driver"), as_dict(r).get("pool"), as_dict(r).get("device"))
                for r in results}

    gone = ids(old) - ids(new)
    status = as_dict(new.get("status"))
    if gone and "devices" in status:
        kept = [d for d in as_list(status["devices"])
                if (as_dict(d).get("driver"), as_dict(d).get("pool"), as_dict(d).get("device"))
                not in gone]
        if kept:
            status["devices"] = kept
        else:
            del status["devices"]
