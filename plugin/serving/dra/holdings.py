"""What the prepared claims hold of each device: the whole device, or shares of its contexts.

Two sides read it. Prepare (:mod:`.shares`) refuses a claim that would give a device two
owners (a whole claim beside shares) or more contexts than the device has. Publishing decides
from it how a device is published: a device some claim holds whole is published whole, and a
device shares hold stays published shared with the contexts it had, never flipping to whole
under them (docs/sharing.md). Both read it from the claim checkpoint, the one record of what
the driver prepared, which outlives the process and the API server's claims.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from plugin.serving.dra.prepared import PreparedClaim


@dataclass(frozen=True)
class DeviceHoldings:
    """Device IDs held whole, and device ID -> contexts its shares hold (summed over
    claims), with who holds them for messages."""

    whole: frozenset[str] = frozenset()
    shared: Mapping[str, int] = field(default_factory=dict)
    holders: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Device ID -> ``namespace/name (uid)`` of each claim holding it, whole or shared."""


def holdings_of(claims: Iterable[PreparedClaim]) -> DeviceHoldings:
    """What ``claims`` (the checkpoint's, or any set of prepared claims) hold of each
    device: a device listed by a claim without a share ID is held whole; a share holds its
    ``contexts`` (1 when a record names none)."""
    whole: set[str] = set()
    shared: dict[str, int] = {}
    holders: dict[str, list[str]] = {}
    for claim in claims:
        name = f"{claim.ref.namespace}/{claim.ref.name} ({claim.ref.uid})"
        for device in claim.devices:
            if device.share_id is None:
                whole.add(device.device_id)
            else:
                shared[device.device_id] = shared.get(device.device_id, 0) + \
                    (device.contexts or 1)
            named = holders.setdefault(device.device_id, [])
            if name not in named:
                named.append(name)
    return DeviceHoldings(frozenset(whole), MappingProxyType(shared),
                          MappingProxyType({k: tuple(v) for k, v in holders.items()}))


def holds_a_share(claim: PreparedClaim) -> bool:
    """Whether any device of ``claim`` is one share of a device (what makes the checkpoint
    major format 3)."""
    return any(device.share_id is not None for device in claim.devices)
