"""The device model's allocation rules, handed to the wire adapters as their ``Allocator``.

The adapters in ``api_versions`` only translate; the decisions (which IDs the kubelet is
shown, which IDs a container gets, which to prefer, whether preferring can matter) and the
count of what was granted belong to the plugin. The server gives each adapter this object,
so the wire layer imports nothing from the plugin.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from plugin.model import allocation
from plugin.model.replica_allocation import (
    allocate_replicas,
    preferred_replicas,
    replicas_preference_matters,
)
from plugin.model.replicas import SEPARATOR, replicate
from plugin.process import metrics
from value_types.allocation import ContainerAllocation
from value_types.devices import DeviceSet

log = logging.getLogger(__name__)


class ModelAllocator:
    """``api_versions.adapter.Allocator`` backed by :mod:`plugin.model.allocation`: every
    device advertised once, under its own ID."""

    def advertised(self, devices: DeviceSet) -> DeviceSet:
        return devices

    def allocate(self, devices: DeviceSet, requested: Sequence[str]) -> ContainerAllocation:
        return allocation.allocate(devices, requested)

    def preferred(self, devices: DeviceSet, available: Sequence[str],
                  must_include: Sequence[str], size: int) -> list[str]:
        return allocation.preferred_allocation(devices, available, must_include, size)

    def preference_matters(self, devices: DeviceSet) -> bool:
        return allocation.preference_matters(devices)

    def counted(self, resource_name: str, generation: str, granted: bool) -> None:
        metrics.allocation(resource_name, generation, granted=granted)


MODEL_ALLOCATOR = ModelAllocator()
"""Stateless: one serves every resource advertised without replicas."""


class ReplicaAllocator(ModelAllocator):
    """The same rules for a resource whose devices are advertised ``count`` times each
    (:mod:`plugin.model.replicas`). The feed keeps carrying real devices; the replica view
    is derived from each snapshot once, when ListAndWatch first sends it, and reused by the
    Allocate and preferred-allocation calls that follow."""

    def __init__(self, resource_name: str, count: int) -> None:
        self.resource_name = resource_name
        self.count = count
        self._last: tuple[DeviceSet, DeviceSet] | None = None
        self._said: set[str] = set()

    def advertised(self, devices: DeviceSet) -> DeviceSet:
        last = self._last
        if last is not None and last[0] is devices:
            return last[1]
        replicas, left_out = replicate(devices, self.count)
        for device_id in sorted(set(left_out) - self._said):
            log.error("%s: device %s is not advertised: its ID holds %r, which separates a "
                      "replica's index (--replicas gives %s %d replicas per device)",
                      self.resource_name, device_id, SEPARATOR, self.resource_name,
                      self.count)
        self._said.update(left_out)
        self._last = (devices, replicas)
        return replicas

    def allocate(self, devices: DeviceSet, requested: Sequence[str]) -> ContainerAllocation:
        return allocate_replicas(devices, self.advertised(devices), requested)

    def preferred(self, devices: DeviceSet, available: Sequence[str],
                  must_include: Sequence[str], size: int) -> list[str]:
        return preferred_replicas(self.advertised(devices), self.count, available,
                                  must_include, size)

    def preference_matters(self, devices: DeviceSet) -> bool:
        return replicas_preference_matters(devices)


def allocator_for(resource_name: str, count: int) -> ModelAllocator:
    """The allocator of a resource advertised ``count`` times per device."""
    return ReplicaAllocator(resource_name, count) if count > 1 else MODEL_ALLOCATOR
