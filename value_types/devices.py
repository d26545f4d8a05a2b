"""The single internal device model: what discovery produces and every wire generation reads.

Frozen and comparable on purpose: a snapshot of the node is a value, so "did anything change"
is ``old != new`` and a snapshot can be shared between the gRPC streams of every kubelet
generation without locks.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

MAX_NUMA_NODES = 1024
"""Linux builds with at most ``1 << CONFIG_NODES_SHIFT`` NUMA nodes, and that shift is at most
10: a NUMA node is ``0..1023`` or it is not a NUMA node. Discovery reports anything else as
unknown, and the wire adapters never send a topology outside this range."""


class Health(StrEnum):
    """The two health values every API generation understands, spelled as on the wire."""

    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"


@dataclass(frozen=True, slots=True)
class DeviceNode:
    """A character device a container needs to use the accelerator."""

    host_path: str
    container_path: str
    permissions: str = "rw"


@dataclass(frozen=True, slots=True)
class Mount:
    """A host path a container needs mounted (libraries, firmware) to use the accelerator."""

    host_path: str
    container_path: str
    read_only: bool = True


@dataclass(frozen=True, slots=True)
class Device:
    """One allocatable unit, as the kubelet will see it.

    ``id`` is what the kubelet schedules and what the container receives: a canonical PCI
    address for real FPGA ports and slots, a small integer for AWS units mode. ``attributes``
    keep discovery facts (AFU ID, driver, vendor/device) as sorted pairs so the value stays
    hashable; ``health_reason`` says why a device is unhealthy, for logs and ``discover``.
    """

    id: str
    backend: str
    health: Health = Health.HEALTHY
    health_reason: str = ""
    numa_node: int | None = None
    nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()
    attributes: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not self.id:
            raise ValueError("a device needs a non-empty id")
        if self.numa_node is not None and not 0 <= self.numa_node < MAX_NUMA_NODES:
            raise ValueError(f"device {self.id}: NUMA node {self.numa_node} is outside "
                             f"0..{MAX_NUMA_NODES - 1}; use None for unknown")
        object.__setattr__(self, "health", Health(self.health))
        object.__setattr__(self, "attributes", tuple(sorted(dict(self.attributes).items())))

    @property
    def healthy(self) -> bool:
        return self.health is Health.HEALTHY

    @property
    def attrs(self) -> dict[str, str]:
        return dict(self.attributes)

    def attribute(self, key: str, default: str = "") -> str:
        return self.attrs.get(key, default)


@dataclass(frozen=True)
class DeviceSet:
    """An immutable snapshot of the devices of one resource (or of a whole node), keyed by ID.

    Iteration order is the natural order of IDs (numeric IDs numerically), so everything
    derived from a snapshot (ListAndWatch lists, preferred allocations, tables) is deterministic.
    """

    _by_id: Mapping[str, Device] = field(default_factory=dict)

    @classmethod
    def of(cls, devices: Iterable[Device]) -> DeviceSet:
        by_id: dict[str, Device] = {}
        for device in devices:
            if device.id in by_id:
                raise ValueError(f"duplicate device id {device.id!r}")
            by_id[device.id] = device
        return cls({k: by_id[k] for k in sorted(by_id, key=natural_key)})

    def __iter__(self) -> Iterator[Device]:
        return iter(self._by_id.values())

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, device_id: object) -> bool:
        return device_id in self._by_id

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DeviceSet):
            return NotImplemented
        return list(self._by_id.items()) == list(other._by_id.items())

    def __hash__(self) -> int:
        return hash(tuple(self._by_id.items()))

    def get(self, device_id: str) -> Device | None:
        return self._by_id.get(device_id)

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(self._by_id)

    def healthy_ids(self) -> tuple[str, ...]:
        return tuple(d.id for d in self if d.healthy)

    def diff(self, newer: DeviceSet) -> DeviceSetDiff:
        added = tuple(i for i in newer.ids if i not in self)
        removed = tuple(i for i in self.ids if i not in newer)
        changed = tuple(i for i in newer.ids if i in self and self._by_id[i] != newer.get(i))
        return DeviceSetDiff(added=added, removed=removed, changed=changed)


@dataclass(frozen=True)
class DeviceSetDiff:
    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)

    def describe(self) -> str:
        parts = []
        for label, ids in (("added", self.added), ("removed", self.removed),
                           ("changed", self.changed)):
            if ids:
                parts.append(f"{label} {','.join(ids)}")
        return "; ".join(parts) or "no change"


def natural_key(device_id: str) -> tuple[int, int, str]:
    """Sort numeric IDs (AWS units) as numbers, everything else (PCI addresses) as text."""
    if device_id.isdigit():
        return (0, int(device_id), "")
    return (1, 0, device_id)
