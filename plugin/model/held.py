"""Which of this plugin's devices running containers hold, and through which API.

A kubelet upgraded or downgraded in place does not stop running containers: after a move from
the device plugin to DRA the containers that got devices through the device plugin keep them,
and after a move back the containers of prepared claims keep theirs. The API the node moves to
must not hand those devices out again until they are released. This module turns what the
kubelet's PodResources API listed (:mod:`api_versions.podresources`) and what the DRA driver's
checkpoint records into one answer: device ID -> who holds it, in words a log line, an Event
and a refused prepare can name. No I/O, no wire types.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from api_versions.podresources import Listing
from plugin.model.replicas import real_ids
from value_types.devices import DeviceSet, Health

DEVICE_PLUGIN = "device-plugin"
DRA = "dra"
NAMED_AT_MOST = 5
"""Holders named in one line; the rest are counted (an Event note is short)."""


@dataclass(frozen=True)
class Held:
    """Devices held through ``api``: device ID -> the holders (``pod ns/name container c``
    or ``claim ns/name``), each sorted; empty when nothing is held."""

    api: str
    devices: Mapping[str, tuple[str, ...]]

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", MappingProxyType(
            {k: tuple(sorted(set(v))) for k, v in sorted(self.devices.items())}))

    def __bool__(self) -> bool:
        return bool(self.devices)

    def __contains__(self, device_id: object) -> bool:
        return device_id in self.devices

    def holders(self) -> list[str]:
        return sorted({h for hs in self.devices.values() for h in hs})

    def describe(self) -> str:
        """``N device(s) (ids) held through <api> by <holders>``, bounded in length."""
        ids = list(self.devices)
        holders = self.holders()
        shown = ", ".join(holders[:NAMED_AT_MOST])
        if len(holders) > NAMED_AT_MOST:
            shown += f" and {len(holders) - NAMED_AT_MOST} more"
        named = ", ".join(ids[:NAMED_AT_MOST]) + (
            f" and {len(ids) - NAMED_AT_MOST} more" if len(ids) > NAMED_AT_MOST else "")
        api = "the device plugin" if self.api == DEVICE_PLUGIN else "DRA claims"
        return f"{len(ids)} device(s) ({named}) held through {api} by {shown}"


def nothing(api: str) -> Held:
    return Held(api, {})


def still_held_through_device_plugin(listing: Listing | None, before: Held,
                                     resources: Collection[str],
                                     device_ids: Collection[str]) -> Held:
    """What the device plugin holds after one read of PodResources: from ``listing``, or,
    when it could not be read (None), what was held ``before``. A failed read never releases
    a device: the kubelet restarting says nothing about the pods still running."""
    if listing is None:
        return before
    return held_through_device_plugin(listing, resources, device_ids)


def held_through_device_plugin(listing: Listing, resources: Collection[str],
                               device_ids: Collection[str]) -> Held:
    """This plugin's devices (``device_ids`` of ``resources``) that containers hold through
    the device plugin, as ``List`` reported them. A replica ID (``--replicas``) counts as
    its device, whatever replica count the instance that granted it ran with: a device any
    one of its replicas is held through is held."""
    found: dict[str, list[str]] = {}
    for entry in listing.devices:
        if entry.resource_name not in resources:
            continue
        holder = f"pod {entry.namespace}/{entry.pod} container {entry.container}"
        for device_id in real_ids(entry.device_ids, device_ids).values():
            found.setdefault(device_id, []).append(holder)
    return Held(DEVICE_PLUGIN, found)


def held_through_dra(claims: Iterable[tuple[str, str, Iterable[str]]], listing: Listing | None,
                     driver: str, names: Mapping[str, str]) -> Held:
    """Devices of prepared claims: ``claims`` as (namespace, name, device IDs) from the
    driver's checkpoint, plus what ``List`` reported for ``driver`` (kubelets 1.34+; device
    names mapped to IDs through ``names``, the pool's name -> ID)."""
    found: dict[str, list[str]] = {}
    for namespace, name, device_ids in claims:
        for device_id in device_ids:
            found.setdefault(device_id, []).append(f"claim {namespace}/{name}")
    for claim in listing.claims if listing is not None else ():
        device_id = names.get(claim.device)
        if claim.driver == driver and device_id is not None:
            found.setdefault(device_id, []).append(
                f"claim {claim.claim_namespace}/{claim.claim_name}")
    return Held(DRA, found)


def held_out(devices: DeviceSet, held: Held) -> DeviceSet:
    """``devices`` with those in ``held`` Unhealthy (the reason names the holders): what the
    device plugin advertises while claims prepared through DRA still hold them. The kubelet
    allocates no Unhealthy device, and takes it again the moment it turns Healthy."""
    if not held or not any(d.id in held for d in devices):
        return devices
    api = "DRA" if held.api == DRA else "the device plugin"
    return DeviceSet.of(
        replace(d, health=Health.UNHEALTHY,
                health_reason=f"held through {api} by {', '.join(held.devices[d.id])}")
        if d.id in held and d.healthy else d
        for d in devices)
