"""Replicas: each device of a resource advertised N times, so N containers share it.

``--replicas b-com.com/accelerator=4`` makes the device plugin list every device of that
resource four times, as ``<device ID>::0`` .. ``<device ID>::3``; the kubelet then counts four
allocatable units per device and gives each to a different container, which all get the
same device nodes. This is what NVIDIA's device plugin calls time-slicing
(``sharing.timeSlicing.resources[].replicas``; ``internal/rm/devices.go``
``NewAnnotatedID`` formats ``"%s::%d"``): nothing in the device enforces the share,
the containers use the loaded function together (OPAE's shared open, XRT's multi-process
mode), so only an admin who knows the function can be shared asks for it.

Only the IDs change: health, NUMA node, device nodes and mounts of every replica are its
device's, so a device turning Unhealthy takes all its replicas with it in the same list.
Everything else in the plugin (discovery, CDI specs, DRA, metrics) keeps speaking of real
devices; the IDs are mapped back where the kubelet's answers come in (Allocate, preferred
allocation, PodResources). No I/O and no wire types here.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import NamedTuple

from plugin.model.resource_names import resource_name_problem
from value_types.devices import Device, DeviceSet

log = logging.getLogger(__name__)

SEPARATOR = "::"
"""Between a device ID and a replica's index, as NVIDIA's plugin writes it: no PCI address,
unit number or Intel port ID holds it, and a CDI or log reader sees at once which device a
replica is of."""
EVERY_RESOURCE = "*"
MAX_REPLICAS = 64
"""The most replicas one device may have. A loaded FPGA function serves a few tens of users
at most (OPAE ``total-contexts``, XRT compute units), and a node runs 110 pods by default,
so more buys nobody anything; every replica is one more entry the kubelet keeps in its
checkpoint and receives again in every ListAndWatch list (the whole list goes out on each
health change), so a typo such as ``=1000`` is refused at start rather than multiplying
every list by a thousand."""
_COUNT = re.compile(r"[0-9]{1,3}")
_INDEX = re.compile(r"0|[1-9][0-9]{0,2}")


class ReplicaCount(NamedTuple):
    """One entry of ``--replicas``: a resource name (or ``*``) and its replica count."""

    resource: str
    count: int

    def __str__(self) -> str:
        return f"{self.resource}={self.count}"


Replicas = tuple[ReplicaCount, ...]
"""The ``replicas`` setting: empty (the default) advertises every device once."""


def parse_replicas(text: str) -> Replicas:
    """``RESOURCE=N[,RESOURCE=N]`` as the setting; ValueError naming the bad entry.

    RESOURCE is a full extended resource name (``b-com.com/accelerator``) or ``*`` for every
    resource the plugin advertises; a named resource's count wins over ``*``'s. N is a whole
    number from 1 to :data:`MAX_REPLICAS` (1: the device's plain ID, as without the flag).
    A name the plugin does not advertise now is accepted: in afu mode a resource appears
    when a function is loaded. Blank text is no entry at all.
    """
    entries: list[ReplicaCount] = []
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            continue
        resource, equals, number = (part.strip() for part in piece.partition("="))
        if not equals or not resource or "=" in number:
            raise ValueError(f"{piece!r} is not RESOURCE=N (e.g. b-com.com/accelerator=4, "
                             "or *=4 for every resource)")
        if resource != EVERY_RESOURCE:
            problem = resource_name_problem(resource)
            if problem:
                raise ValueError(f"{piece!r}: {problem}")
        if not _COUNT.fullmatch(number) or not 1 <= int(number) <= MAX_REPLICAS:
            raise ValueError(f"{piece!r}: the number of replicas must be a whole number from "
                             f"1 to {MAX_REPLICAS}")
        if any(e.resource == resource for e in entries):
            raise ValueError(f"{text.strip()!r} gives {resource} more than once")
        entries.append(ReplicaCount(resource, int(number)))
    return tuple(entries)


def replicas_of(setting: Iterable[ReplicaCount], resource: str) -> int:
    """How many times ``resource``'s devices are advertised: its own entry, else ``*``'s,
    else once."""
    counts = {e.resource: e.count for e in setting}
    return counts.get(resource, counts.get(EVERY_RESOURCE, 1))


def announce(setting: Sequence[ReplicaCount], mode: str, single_resource: str,
             api: str = "device-plugin") -> None:
    """Say at start which resources the setting can reach (nothing without it).

    A name matching nothing is not an error (afu mode's resources follow the loaded
    functions, so one may appear later), but a mistyped name would silently share nothing:
    in single mode, where the one resource is known, a name that is not it is warned about;
    in afu mode each resource says its count when it appears. With ``--api dra`` nothing is
    advertised through the device plugin, which is said too."""
    if not setting:
        return
    if api == "dra":
        log.warning("--replicas has no effect with --api dra: it applies to the device "
                    "plugin only (DRA shares devices through --dra-share)")
        return
    named = [e.resource for e in setting if e.resource != EVERY_RESOURCE]
    if mode != "single":
        log.info("--replicas %s: in afu mode the resources follow the loaded functions; each "
                 "says how many times its devices are advertised when it appears",
                 ",".join(map(str, setting)))
        return
    unknown = [n for n in named if n != single_resource]
    if unknown:
        log.warning("--replicas names %s, which this plugin never advertises: it advertises "
                    "only %s (--resource-mode single); those entries have no effect",
                    ", ".join(unknown), single_resource)
    log.info("--replicas: each device of %s is advertised %d time(s)", single_resource,
             replicas_of(setting, single_resource))


def replica_id(device_id: str, index: int) -> str:
    """``<device ID>::<index>``."""
    return f"{device_id}{SEPARATOR}{index}"


def device_of(advertised_id: str) -> tuple[str, int] | None:
    """The device ID and index a replica ID names, or None if it names no replica.

    Only the canonical spelling is a replica ID (``a::1``, never ``a::01`` or ``a::+1``):
    the kubelet only ever sends IDs it was given, so anything else is a forged or stale ID
    and must not alias a real replica."""
    device_id, separator, index = advertised_id.rpartition(SEPARATOR)
    if not separator or not device_id or not _INDEX.fullmatch(index):
        return None
    return device_id, int(index)


def replicable(device_id: str) -> bool:
    """Whether the device's replica IDs say unambiguously which device they are of: not if
    its ID holds the separator. ``a::1``'s replica ``a::1::0`` reads as device ``a``'s
    replica to whatever cuts at the first ``::`` (NVIDIA's ``AnnotatedID.Split`` does,
    ``strings.SplitN(id, "::", 2)``; so might an admin's script), and the ID ``a::1``
    itself as a replica of ``a`` wherever both could be advertised."""
    return SEPARATOR not in device_id


def replicate(devices: DeviceSet, count: int) -> tuple[DeviceSet, list[str]]:
    """The devices as the kubelet sees them, and the IDs of those left out.

    ``count`` 1 returns ``devices`` itself. Otherwise each device becomes ``count`` copies
    with replica IDs, in device order and then index order (what ListAndWatch sends and
    what an admin reads in a node's allocatable list); a device whose ID cannot be
    replicated (:func:`replicable`) is left out, since no ID for it would be unambiguous.
    """
    if count <= 1:
        return devices, []
    by_id: dict[str, Device] = {}
    left_out: list[str] = []
    for device in devices:
        if not replicable(device.id):
            left_out.append(device.id)
            continue
        for index in range(count):
            copy = replace(device, id=replica_id(device.id, index))
            by_id[copy.id] = copy
    return DeviceSet(by_id), left_out


def real_ids(advertised: Iterable[str], devices: Iterable[str]) -> dict[str, str]:
    """Advertised ID -> device ID, for IDs read back from the kubelet (PodResources) when
    which replica count gave them is not known: a device's own ID is itself; a replica ID
    of a device in ``devices`` (whatever the count was) is that device; anything else is
    not this plugin's."""
    known = set(devices)
    mapped: dict[str, str] = {}
    for advertised_id in advertised:
        if advertised_id in known:
            mapped[advertised_id] = advertised_id
        elif (replica := device_of(advertised_id)) is not None and replica[0] in known:
            mapped[advertised_id] = replica[0]
    return mapped
