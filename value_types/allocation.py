"""What Allocate grants a container, or why it refuses: the same for every wire generation.

The decisions themselves are device logic (``plugin.model.allocation``); the wire adapters
only translate these values, so they live below both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from value_types.devices import Device, DeviceNode, Mount


class AllocationError(ValueError):
    """A request the plugin must refuse as a whole; the message names every offending ID."""


@dataclass(frozen=True)
class ContainerAllocation:
    """Everything one container receives for its devices, independent of the wire generation."""

    device_ids: tuple[str, ...]
    envs: Mapping[str, str] = field(default_factory=dict)
    nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()
    devices: tuple[Device, ...] = ()
