"""Allocate and preferred allocation for a replicated resource (``--replicas``).

The kubelet asks for replica IDs (``<device ID>::<i>``); a container gets the devices those
replicas are of, each device's nodes and mounts once however many of its replicas it holds.
Refusals are worded as for any resource (:func:`plugin.model.allocation.refusals`, run on
the replica IDs as advertised), so an unknown index or device is an "unknown device ID".

Preferred allocation spreads: each replica is taken from the device with the fewest of its
replicas already taken (by other containers, whose replicas are missing from ``available``,
or by this request), ties going to a device on a NUMA node the request already uses, then
to the first device in natural order. A container that asks for two replicas wants two
users' worth of a function, which two devices give and one shared device does not, and
containers spread over the devices each get a larger part of their device. NVIDIA's plugin
decides the same way for time-sliced GPUs: its default ``distributed`` policy
(``internal/rm/allocate.go``, comparator of ``spec.AllocationPolicyDistributed``) prefers
"GPUs with the fewest allocated replicas to spread workload evenly across physical GPUs",
counting allocated as total minus available replicas. Packing (the NUMA rule of
unreplicated resources) would put every container on the first device while others idle.
"""

from __future__ import annotations

from collections.abc import Sequence

from plugin.model.allocation import ENV_DEVICES, ENV_REPLICAS, ENV_UNITS, UNITS_BACKEND, refusals
from plugin.model.replicas import device_of, replica_id
from value_types.allocation import AllocationError, ContainerAllocation
from value_types.devices import DeviceSet, natural_key


def allocate_replicas(devices: DeviceSet, advertised: DeviceSet,
                      requested: Sequence[str]) -> ContainerAllocation:
    """One container's share of ``devices`` for the replica IDs ``requested``.

    ``advertised`` is what ListAndWatch sent for ``devices`` (:func:`plugin.model.replicas
    .replicate`): a request is checked against it, so only IDs the kubelet was given pass.
    The container's ``device_ids`` are the devices, once each, in request order (what CDI
    names and the log show); the environment lists one entry per replica.
    """
    problems = refusals(advertised, requested)
    if problems:
        raise AllocationError("; ".join(problems))
    pairs = [device_of(i) for i in requested]
    held = [pair for pair in pairs if pair is not None]
    device_ids = tuple(dict.fromkeys(d for d, _ in held))
    granted = tuple(d for i in device_ids if (d := devices.get(i)) is not None)
    if len(held) != len(requested) or len(granted) != len(device_ids):
        # Advertised but not mappable back: the two snapshots disagree, a bug to refuse on.
        raise AllocationError(f"replica IDs {', '.join(requested)} do not match the devices")
    listed = ",".join(d for d, _ in held)
    envs = {ENV_UNITS: listed, ENV_REPLICAS: ",".join(str(i) for _, i in held)}
    if any(d.backend != UNITS_BACKEND for d in granted):
        envs[ENV_DEVICES] = listed
    return ContainerAllocation(
        device_ids=device_ids,
        envs=envs,
        nodes=tuple(dict.fromkeys(n for d in granted for n in d.nodes)),
        mounts=tuple(dict.fromkeys(m for d in granted for m in d.mounts)),
        devices=granted,
    )


def preferred_replicas(advertised: DeviceSet, count: int, available: Sequence[str],
                       must_include: Sequence[str], size: int) -> list[str]:
    """``size`` replica IDs from ``available``, ``must_include`` first, the rest spread
    (``count`` 2 or more: a resource advertised once keeps the NUMA packing of
    :func:`plugin.model.allocation.preferred_allocation`).

    Deterministic. As for unreplicated resources, never an ID that is not both available
    and a healthy advertised replica, never more than ``size``, none for a size below 1.
    """
    if size <= 0:
        return []
    usable = {i for i in available if (d := advertised.get(i)) is not None and d.healthy}
    chosen = [i for i in dict.fromkeys(must_include) if i in usable][:size]
    free: dict[str, list[int]] = {}
    numa: dict[str, int | None] = {}
    for advertised_id in usable.difference(chosen):
        pair = device_of(advertised_id)
        device = advertised.get(advertised_id)
        if pair is not None and device is not None:
            free.setdefault(pair[0], []).append(pair[1])
            numa[pair[0]] = device.numa_node
    taken = {device_id: count - len(indexes) for device_id, indexes in free.items()}
    anchored = {d.numa_node for i in chosen if (d := advertised.get(i)) is not None}

    def order(device_id: str) -> tuple[int, int, tuple[int, int, str]]:
        node = numa[device_id]
        return (taken[device_id], 0 if node is not None and node in anchored else 1,
                natural_key(device_id))

    while len(chosen) < size and free:
        device_id = min(free, key=order)
        indexes = free[device_id]
        index = min(indexes)
        indexes.remove(index)
        if not indexes:
            del free[device_id]
        taken[device_id] += 1
        anchored.add(numa[device_id])
        chosen.append(replica_id(device_id, index))
    return chosen


def replicas_preference_matters(devices: DeviceSet) -> bool:
    """Whether spreading can choose differently from the kubelet: only with two devices or
    more (the replicas of one device are interchangeable). Health is left out, as for
    unreplicated resources: the answer is part of the registration."""
    return len(devices) > 1
