"""What the scheduler's DRA plugin writes into a claim, for the claims of one emulator.

:func:`allocate_claim` allocates a ResourceClaim on one node as kube-scheduler does
(k8s.io/dynamic-resource-allocation ``structured/internal/stable/allocator.go``, for the parts
a node-local FPGA driver meets): for each ``exactly`` request, ``count`` devices (1 unless
said; every matching one for ``allocationMode: All``) from the node's ResourceSlices (the
newest generation of each pool), each one

* matched by every selector of the request's DeviceClass, then every selector of the request,
  in order, with a real CEL evaluator (:mod:`compat_tests.cel_devices`); a CEL runtime error
  aborts the whole allocation, as ``selectorsMatch`` does;
* not tainted ``NoSchedule`` or ``NoExecute`` without a matching toleration in the request
  (KEP-5055 ``allocator.go`` ``allTaintsTolerated``; ``None`` taints never block);
* not already in another claim's allocation, and not given twice in this one;
* with the DRAConsumableCapacity gate on (the server model's gate, 1.36+), fitting the
  request's ``capacity.requests`` (:mod:`compat_tests.apiserver.capacity`): a request naming a
  capacity the device lacks, or more than its policy or what is left allows, does not match.

Consumable capacity (KEP-5075), from dynamic-resource-allocation
``structured/internal/incubating/allocator_incubating.go`` (kubernetes/kubernetes commit
03ab440c41a8098613d2149f10b367c7f7ce32c8, ``allocateDevice``, ``CmpRequestOverCapacity``) and
``pkg/scheduler/framework/plugins/dynamicresources/allocateddevices.go`` (commit
030880a5dc5449403c6d1f0aa146a7dc21d6c6dc, ``foreachAllocatedDevice``): a device with
``allowMultipleAllocations: true`` is never marked in use, so it goes to several claims, and to
several requests of one claim, each time as a share: the result gets ``shareID`` (a fresh
random UUID, ``GenerateShareID``) and ``consumedCapacity`` with what the request takes of every
capacity of the device (zero included; left out when the device has no capacity). A result
without ``shareID`` holds its device whole: no share and no other claim gets it. Shares count
only as capacity: a device published whole again is refused to a claim only when the capacity
it takes (all of it, with no policy and nothing asked) no longer fits beside them; without any
capacity it is handed out (upstream does so; only the driver can refuse that at prepare).
With the gate off, every result counts as whole, ``allowMultipleAllocations`` is not looked at
and a request with capacity requests is an error, as the allocator says it.

It writes ``status.allocation``: ``devices.results`` (request, driver, pool, device) in
request order, ``devices.config`` with each request's class configuration first
(``source: FromClass``, ``requests: [<request>]``) then the claim's own (``source:
FromClaim``, with its ``requests`` as written), and the ``nodeSelector`` naming the node, all
through :meth:`ApiServerEmulator.set_claim_status`, which validates it like a status write.
With ``class_config_requests=False`` each class configuration names no request, as schedulers
before kubernetes#134793 wrote them (``allocator.go``: ``Requests: nil, // All of them``).

:func:`extended_resource_claim` is the special claim KEP-5004 has the scheduler create for a
pod that asks for an extended resource a DeviceClass maps (``extendedResourceName``): owned
by the pod, annotated ``resource.kubernetes.io/extended-resource-claim: "true"``, named
``<pod>-extended-resources-<random>``, one request ``container-<i>-request-<j>`` per
container and resource (kubernetes/kubernetes ``pkg/scheduler/framework/plugins/
dynamicresources/extended`` request naming, commit 00faa5e7ae978d4e75e80649cdb2cc46f98ba152),
then allocated as above.

A refusal says ``cannot allocate all claims`` (the scheduler's Filter status) and which
request found too few devices, naming the capacity it asked.

Not modelled: ``firstAvailable`` sub-requests, constraints (``matchAttribute``), admin
access, partitionable devices, slices that are not node-local, and the search: the scheduler
backtracks over every combination, the emulator takes the first device that fits for each
request in turn. Both find the same first solution unless an earlier request's device leaves a
later request no room that another choice would have left.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from compat_tests import cel_devices
from compat_tests.apiserver import capacity, objects

if TYPE_CHECKING:
    from compat_tests.apiserver.server import ApiServerEmulator

Obj = dict[str, Any]
EXTENDED_RESOURCE_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


class AllocationError(Exception):
    """The claim cannot be allocated on the node; the message says which request and why."""


def allocate_claim(api: ApiServerEmulator, namespace: str, name: str, node_name: str, *,
                   class_config_requests: bool = True, status_extra: Obj | None = None) -> Obj:
    """Allocate claim ``namespace/name`` on ``node_name``; the claim as stored after.
    ``status_extra`` is written with the allocation (a scheduler's ``bindClaim`` writes the
    pod's reservation and ``allocationTimestamp`` in the same update)."""
    claim = api.get("resourceclaims", name, namespace)
    if claim is None:
        raise AllocationError(f"resourceclaim {namespace}/{name} not found")
    if (claim.get("status") or {}).get("allocation"):
        raise AllocationError(f"resourceclaim {namespace}/{name} is allocated already")
    candidates = node_devices(api, node_name)
    state = allocated_state(api)
    results: list[Obj] = []
    class_config: list[Obj] = []
    for request in claim["spec"]["devices"].get("requests", []):
        exact = request.get("exactly")
        where = f"claim {namespace}/{name} request {request['name']!r}"
        if exact is None:
            raise AllocationError(f"{where}: only exactly requests are emulated")
        if exact.get("capacity") is not None and not state.consumable:
            raise AllocationError(f"{where}: has capacity requests, but the "
                                  "DRAConsumableCapacity feature is disabled")
        device_class = api.get("deviceclasses", exact["deviceClassName"])
        if device_class is None:
            raise AllocationError(f"{where}: DeviceClass {exact['deviceClassName']!r} not found")
        for driver, pool, device, taken in _pick(f"{namespace}/{name}", request["name"], exact,
                                                 device_class, candidates, state):
            extra: Obj = {}
            extra.update(binding_of(api, candidates, (driver, pool, device)))
            if taken is not None:
                extra["shareID"] = str(uuid.uuid4())
                if taken:
                    extra["consumedCapacity"] = {n: text for n, (_, text) in taken.items()}
            results.append(objects.result(request["name"], driver, pool, device, **extra))
        for entry in device_class["spec"].get("config", []):
            named = {"requests": [request["name"]]} if class_config_requests else {}
            class_config.append({"source": "FromClass", **named, **copy.deepcopy(entry)})
    claim_config = [{"source": "FromClaim", **copy.deepcopy(entry)}
                    for entry in claim["spec"]["devices"].get("config", [])]
    allocation = objects.allocation(results, node_name=node_name,
                                    config=class_config + claim_config)
    status = dict(claim.get("status") or {})
    status["allocation"] = allocation
    for key, value in (status_extra or {}).items():
        if key == "allocation":
            allocation.update(value)
        else:
            status[key] = value
    updated: Obj = api.set_claim_status(namespace, name, status)
    return updated


def binding_of(api: ApiServerEmulator, candidates: Sequence[tuple[str, str, Obj]],
               key: tuple[str, str, str]) -> Obj:
    """The device's binding conditions, which the allocator copies into its result when
    DRADeviceBindingConditions and DRAResourceClaimDeviceStatus are on (dynamic-resource-
    allocation ``structured/internal/stable/allocator.go``, ``allocateDevice``:
    ``BindingConditions: device.BindingConditions``)."""
    if not (api.model.enabled("DRADeviceBindingConditions")
            and api.model.enabled("DRAResourceClaimDeviceStatus")):
        return {}
    device = next((d for dr, p, d in candidates if (dr, p, d["name"]) == key), {})
    return {k: list(device[k]) for k in ("bindingConditions", "bindingFailureConditions")
            if device.get(k)}


DeviceKey = tuple[str, str, str]
Chosen = tuple[str, str, str, capacity.Taken | None]


@dataclass
class AllocatedState:
    """What claims hold, as the scheduler's ``allocatedDevices`` tracker gathers it: devices
    held whole (a result without ``shareID``, or any result while the gate is off) and, per
    shared device, the sum of its shares' ``consumedCapacity``."""

    consumable: bool
    whole: set[DeviceKey] = field(default_factory=set)
    held: dict[DeviceKey, capacity.Amounts] = field(default_factory=dict)


def _pick(claim: str, request: str, exact: Mapping[str, Any], device_class: Obj,
          candidates: Sequence[tuple[str, str, Obj]], state: AllocatedState) -> list[Chosen]:
    """The request's devices, recorded in ``state`` as taken; a share carries what it takes
    of each capacity, a device given whole carries None."""
    mode = exact.get("allocationMode", "ExactCount")
    wanted = int(exact.get("count", 1)) if mode == "ExactCount" else None
    class_selectors = device_class["spec"].get("selectors", [])
    selectors = exact.get("selectors", [])
    tolerations = exact.get("tolerations", [])
    asked = capacity.requested(exact) if state.consumable else None
    chosen: list[Chosen] = []
    for driver, pool, device in candidates:
        key = (driver, pool, device["name"])
        if key in state.whole or any(c[:3] == key for c in chosen) or not tolerated(
                device.get("taints", []), tolerations):
            continue
        try:
            matches = (cel_devices.selectors_match(class_selectors, device, driver,
                                                   consumable_capacity=state.consumable)
                       and cel_devices.selectors_match(selectors, device, driver,
                                                       consumable_capacity=state.consumable))
        except cel_devices.CelRuntimeError as exc:
            origin = "class " + device_class["metadata"]["name"]
            raise AllocationError(f"claim {claim} request {request!r}: {origin}: {exc}") from exc
        if not matches:
            continue
        taken = capacity.fits(device, asked, state.held.get(key, {})) if state.consumable else {}
        if taken is None:
            continue
        if state.consumable and device.get("allowMultipleAllocations") is True:
            capacity.add(state.held.setdefault(key, {}), taken)
            chosen.append((*key, taken))
        else:
            state.whole.add(key)
            chosen.append((*key, None))
        if wanted is not None and len(chosen) == wanted:
            return chosen
    if wanted is None and chosen:
        return chosen
    left = "" if not asked else " and have the capacity asked left (" + ", ".join(
        f"{n}: {v}" for n, v in sorted(asked.items())) + ")"
    raise AllocationError(
        f"cannot allocate all claims: claim {claim} request {request!r}: {len(chosen)} of "
        f"{wanted if wanted is not None else 'at least 1'} devices of class "
        f"{device_class['metadata']['name']!r} are free, untainted and selected{left}")


def node_devices(api: ApiServerEmulator, node_name: str) -> list[tuple[str, str, Obj]]:
    """``(driver, pool, device)`` of every device the node's slices publish, taking only the
    newest generation of each pool, as the scheduler does (older slices are being replaced)."""
    slices = [s for s in api.list("resourceslices") if s["spec"].get("nodeName") == node_name]
    newest: dict[tuple[str, str], int] = {}
    for slice_obj in slices:
        key = (slice_obj["spec"]["driver"], slice_obj["spec"]["pool"]["name"])
        newest[key] = max(newest.get(key, -1), int(slice_obj["spec"]["pool"]["generation"]))
    found = []
    for slice_obj in sorted(slices, key=lambda s: s["metadata"]["name"]):
        spec = slice_obj["spec"]
        key = (spec["driver"], spec["pool"]["name"])
        if int(spec["pool"]["generation"]) != newest[key]:
            continue
        found += [(key[0], key[1], device) for device in spec.get("devices", [])]
    return found


def allocated_state(api: ApiServerEmulator) -> AllocatedState:
    """What every claim of this emulator holds (``foreachAllocatedDevice``)."""
    state = AllocatedState(consumable=api.model.enabled("DRAConsumableCapacity"))
    for claim in api.list("resourceclaims"):
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in allocation.get("devices", {}).get("results", []):
            key = (result["driver"], result["pool"], result["device"])
            if not state.consumable or result.get("shareID") is None:
                state.whole.add(key)
                continue
            capacity.add(state.held.setdefault(key, {}), result.get("consumedCapacity") or {})
    return state


def tolerated(taints: Sequence[Mapping[str, Any]],
              tolerations: Sequence[Mapping[str, Any]]) -> bool:
    """Whether every taint that blocks allocation has a toleration that matches it."""
    return all(taint.get("effect") not in BLOCKING_EFFECTS
               or any(_tolerates(t, taint) for t in tolerations) for taint in taints)


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    operator = toleration.get("operator", "Equal")
    if operator == "Exists":
        return not toleration.get("key") or toleration["key"] == taint.get("key")
    return (toleration.get("key") == taint.get("key")
            and toleration.get("value", "") == taint.get("value", ""))


def class_for_resource(api: ApiServerEmulator, resource_name: str) -> str:
    """The DeviceClass whose ``extendedResourceName`` is ``resource_name`` (KEP-5004), or the
    class named by ``deviceclass.resource.kubernetes.io/<class>``."""
    implicit = "deviceclass.resource.kubernetes.io/"
    if resource_name.startswith(implicit):
        return resource_name[len(implicit):]
    named = sorted(c["metadata"]["name"] for c in api.list("deviceclasses")
                   if c["spec"].get("extendedResourceName") == resource_name)
    if not named:
        raise AllocationError(f"no DeviceClass maps the extended resource {resource_name!r}")
    # The scheduler takes the newest class when several map one name; names stand in here.
    return named[0]


def extended_resource_claim(api: ApiServerEmulator, namespace: str, pod_name: str, container: str,
                            resource_name: str, count: int, *, node_name: str,
                            pod_uid: str | None = None, container_index: int = 0,
                            resource_index: int = 0) -> Obj:
    """Create the pod's special claim for ``count`` of ``resource_name`` in ``container``, and
    allocate it on ``node_name``; the stored claim. ``container_index`` and
    ``resource_index`` are the container's place among the pod's init and regular
    containers and the resource's among its requests, sorted, which name the request.
    The container's name is only the pod's business (``extendedResourceClaimStatus``
    request mappings); it is checked to be given."""
    if not container:
        raise ValueError("the container asking for the resource must be named")
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    request = f"container-{container_index}-request-{resource_index}"
    claim = objects.claim(namespace, "", [(request, class_for_resource(api, resource_name))],
                          annotations={EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"})
    meta = claim["metadata"]
    del meta["name"]
    meta["generateName"] = f"{pod_name}-extended-resources-"
    meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": pod_name,
                                "uid": pod_uid or str(uuid.uuid4()), "controller": True,
                                "blockOwnerDeletion": True}]
    claim["spec"]["devices"]["requests"][0]["exactly"].update(
        allocationMode="ExactCount", count=count)
    api.create_namespace(namespace)
    created = api.create(claim)
    return allocate_claim(api, namespace, created["metadata"]["name"], node_name)


def request_mapping(claim: Mapping[str, Any], container: str,
                    resource_name: str) -> list[Obj]:
    """The pod's ``status.extendedResourceClaimStatus.requestMappings`` for ``claim``."""
    return [{"containerName": container, "resourceName": resource_name,
             "requestName": r["name"]} for r in claim["spec"]["devices"]["requests"]]
