"""What a container gets for a set of device IDs, and which IDs to prefer: no wire types here.

Every API generation's Allocate and GetPreferredAllocation are thin translations of the two
functions below, so all generations refuse the same requests with the same words.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar

from value_types.allocation import AllocationError, ContainerAllocation
from value_types.devices import Device, DeviceSet, natural_key

ENV_UNITS = "ACCELERATOR_UNITS"
"""Comma-joined allocated IDs, in request order (the b<>com plugin's variable)."""
ENV_DEVICES = "ACCELERATOR_DEVICES"
"""Same IDs, set for PCI-addressed devices (the b<>com Intel plugin's variable, now unmangled)."""
ENV_REPLICAS = "ACCELERATOR_REPLICAS"
"""With ``--replicas``: the replica index of each entry of the two above, comma-joined in the
same order (those keep listing device IDs, so a device shows once per replica held)."""
ENV_SHARE_ID = "ACCELERATOR_SHARE_ID"
"""Under DRA, for a request holding shares of devices (KEP-5075): each device's ``shareID``,
comma-joined and aligned with :data:`ENV_DEVICES` (empty for a device held whole), so a
process can tell its share from its neighbours' (one OPAE or XRT context per share)."""
ENV_SHARE_CONTEXTS = "ACCELERATOR_SHARE_CONTEXTS"
"""Beside :data:`ENV_SHARE_ID`: how many of each device's contexts the share holds."""
UNITS_BACKEND = "units"

T = TypeVar("T")


def allocate(devices: DeviceSet, requested: Sequence[str]) -> ContainerAllocation:
    """Validate ``requested`` against the current snapshot and build the container's share.

    Nothing is allocated unless every ID is known, healthy and listed once: the kubelet
    rejects the pod for good on an error, so a half-granted request would be worse than none.
    """
    problems = refusals(devices, requested)
    if problems:
        raise AllocationError("; ".join(problems))
    chosen = tuple(devices.get(i) for i in requested)
    granted: tuple[Device, ...] = tuple(d for d in chosen if d is not None)
    joined = ",".join(requested)
    envs = {ENV_UNITS: joined}
    if any(d.backend != UNITS_BACKEND for d in granted):
        envs[ENV_DEVICES] = joined
    return ContainerAllocation(
        device_ids=tuple(requested),
        envs=envs,
        nodes=_unique(n for d in granted for n in d.nodes),
        mounts=_unique(m for d in granted for m in d.mounts),
        devices=granted,
    )


def refusals(devices: DeviceSet, requested: Sequence[str]) -> list[str]:
    """Why ``requested`` cannot be granted from ``devices`` (the IDs as advertised); empty
    when it can."""
    if not requested:
        return ["no device IDs requested"]
    if len(set(requested)) == len(requested) and all(
        (d := devices.get(i)) is not None and d.healthy for i in requested
    ):
        return []  # the kubelet's every request: answered without building the diagnosis
    problems = []
    seen: set[str] = set()
    duplicated = sorted({i for i in requested if i in seen or seen.add(i)}, key=natural_key)
    if duplicated:
        problems.append(f"device IDs requested more than once: {name_some(duplicated)}")
    unknown = [i for i in dict.fromkeys(requested) if i not in devices]
    if unknown:
        problems.append(
            f"unknown device IDs: {name_some(unknown)} (this plugin owns {_describe_ids(devices)})"
        )
    unhealthy = [
        d for i in dict.fromkeys(requested) if (d := devices.get(i)) is not None and not d.healthy
    ]
    if unhealthy:
        problems.append("unhealthy device IDs: " + name_some(
            [f"{d.id} ({d.health_reason or 'unhealthy'})" for d in unhealthy]))
    return problems


NAMED_AT_MOST = 5
"""Offending IDs named in a refusal; the rest are counted. The refusal travels in a gRPC
status message (trailing metadata, a few KiB at most) and into the log: 10,000 unknown IDs
once turned INVALID_ARGUMENT into RESOURCE_EXHAUSTED and a log line of megabytes."""
SHOWN_CHARACTERS = 64
"""Longest piece of one ID shown; a longer ID is cut and its length given."""


def name_some(items: Sequence[str]) -> str:
    """The first few items, each cut to a readable length, and how many more there are."""
    shown = [_shorten(item) for item in items[:NAMED_AT_MOST]]
    if len(items) > NAMED_AT_MOST:
        shown.append(f"and {len(items) - NAMED_AT_MOST:,} more")
    return ", ".join(shown)


def _shorten(item: str) -> str:
    if len(item) <= SHOWN_CHARACTERS:
        return item
    return f"{item[:SHOWN_CHARACTERS]}... ({len(item):,} characters)"


def _describe_ids(devices: DeviceSet) -> str:
    ids = devices.ids
    if not ids:
        return "no devices"
    if all(i.isdigit() for i in ids) and [int(i) for i in ids] == list(range(len(ids))):
        return f"0..{len(ids) - 1}"
    if len(ids) > 8:
        return ", ".join(ids[:8]) + f" and {len(ids) - 8} more"
    return ", ".join(ids)


def _unique(items: Iterable[T]) -> tuple[T, ...]:
    return tuple(dict.fromkeys(items))


def preference_matters(devices: DeviceSet) -> bool:
    """Whether a preferred allocation can ever differ in effect from the kubelet's own pick.

    It only does by packing NUMA nodes, so only where the devices sit on more than one
    placement (two NUMA nodes, or a NUMA node and none). With every device on one node, or
    none carrying topology, every healthy choice is as good as any other, and advertising
    GetPreferredAllocation would only make the kubelet pay one more call per container for
    nothing. Health is left out on purpose: the answer is part of the registration, and a
    device going Unhealthy must not make the plugin register again.
    """
    return len({d.numa_node for d in devices}) > 1


def preferred_allocation(
    devices: DeviceSet,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
) -> list[str]:
    """Choose ``size`` IDs from ``available``, keeping ``must_include`` and packing NUMA nodes.

    Deterministic for a given input. The must-include IDs come first, in the order given.
    The rest is taken, in natural ID order, from the fewest NUMA nodes possible: first the
    NUMA nodes the must-include devices sit on, then a single node that can hold the whole
    remainder (the smallest such, leaving big nodes whole for big requests), and only if no
    node can, the largest nodes first.

    Never proposes an ID that is not both available and a healthy device of this plugin
    (must-include IDs too: a kubelet only sends available ones, but a hostile or buggy
    client must not make the plugin vouch for a device it does not own), never more than
    ``size`` IDs, and none for a size below 1.
    """
    usable = {
        i for i in available if (d := devices.get(i)) is not None and d.healthy
    }
    if size <= 0:
        return []
    chosen = [i for i in dict.fromkeys(must_include) if i in usable][:size]
    remaining = size - len(chosen)
    if remaining <= 0:
        return chosen
    candidates = [
        d
        for i in dict.fromkeys(available)
        if i in usable and i not in chosen and (d := devices.get(i)) is not None
    ]
    groups: dict[int | None, list[Device]] = {}
    for device in sorted(candidates, key=lambda d: natural_key(d.id)):
        groups.setdefault(device.numa_node, []).append(device)
    anchored = {d.numa_node for i in chosen if (d := devices.get(i)) is not None}

    def group_order(numa: int | None) -> tuple[int, int, int, int]:
        group = groups[numa]
        fits = len(group) >= remaining
        return (
            0 if numa in anchored and numa is not None else 1,
            0 if fits else 1,
            len(group) if fits else -len(group),
            numa if numa is not None else 1 << 30,
        )

    for numa in sorted(groups, key=group_order):
        take = groups[numa][:remaining]
        chosen.extend(d.id for d in take)
        remaining -= len(take)
        if remaining == 0:
            break
    return chosen
