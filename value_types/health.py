"""A device's health as the DRA driver reports it to the kubelet, without wire types.

Three states where the device plugin API has two: a device whose health is not being read
(discovery stalled, or discovery does not have it) is UNKNOWN, never HEALTHY.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class HealthState(StrEnum):
    UNKNOWN = "Unknown"
    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"


@dataclass(frozen=True, slots=True)
class DeviceHealthReport:
    """One device of a NodeWatchResources message, without wire types."""

    pool: str
    device: str
    state: HealthState
    last_updated: int
    """Unix seconds when the driver last determined the state (when the list was built)."""
    timeout_seconds: int
    message: str = ""
