"""The device model's allocation rules, handed to the wire adapters as their ``Allocator``.

The adapters in ``api_versions`` only translate; the decisions (which IDs a container gets,
which to prefer, whether preferring can matter) and the count of what was granted belong to
the plugin. The server gives each adapter this object, so the wire layer imports nothing
from the plugin.
"""

from __future__ import annotations

from collections.abc import Sequence

from plugin.model import allocation
from plugin.process import metrics
from value_types.allocation import ContainerAllocation
from value_types.devices import DeviceSet


class ModelAllocator:
    """``api_versions.adapter.Allocator`` backed by :mod:`plugin.model.allocation`."""

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
"""Stateless: one serves every resource."""
