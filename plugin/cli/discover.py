"""What ``discover`` prints: the devices this node would serve, and why any is unhealthy.

The first thing an operator runs on a node where pods do not get their FPGA, so every
column answers a support question: which ID the kubelet sees, which driver found it, which
node the container gets, where it sits (NUMA), what is loaded (an Intel port's AFU ID, an
Alveo card's shell and xclbin, an AWS slot's application function IDs), whether it can be
given another function here (``--programming``, the same rule the DRA driver publishes as
``programmable``) and what is wrong. Below the
table, the settings not at their defaults and where each came from (a flag, a variable, the
config file), since a setting nobody remembers making is the other usual answer; with
``--json`` that line goes to stderr, and stdout stays the list of devices scripts read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from plugin.cli.sources import Origin, describe
from plugin.model.programming import WhyNot, never_why
from plugin.model.replicas import ReplicaCount, replicas_of
from plugin.model.resources import group_by_resource
from plugin.programming.image_checks import held_function
from plugin.serving.dra.share_setting import FamilyShare, setting_of, sharing_on
from value_types.devices import Device, DeviceSet

if TYPE_CHECKING:
    from plugin.programming.load_record import LoadRecord

COLUMNS = ("ID", "BACKEND", "DRIVER", "NODE", "NUMA", "LOADED", "PROGRAMMABLE", "HEALTH",
           "WHY")
NONE = "-"


def render_table(devices: Sequence[Device], origins: Sequence[Origin] = (),
                 why_not: WhyNot = never_why, told: Mapping[str, str] | None = None,
                 records: Mapping[str, LoadRecord] | None = None,
                 notes: Sequence[str] = ()) -> str:
    """Aligned columns, one line per device; a line saying so when there are none.

    ``notes`` follow after a blank line (how many IDs each resource gets with
    ``--replicas``, how each device would be published with ``--dra-share``). A last line,
    after a blank one, names the settings given and where from, if any were.
    """
    rows = [_cells(d, why_not, (told or {}).get(d.id), (records or {}).get(d.id))
            for d in devices]
    widths = [max(len(r[i]) for r in [COLUMNS, *rows]) for i in range(len(COLUMNS))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    lines = [line(COLUMNS), *(line(r) for r in rows)]
    if not rows:
        lines.append("(no accelerators found)")
    if notes:
        lines += ["", *notes]
    if origins:
        lines += ["", describe(origins)]
    return "\n".join(lines)


def render_json(devices: Sequence[Device], why_not: WhyNot = never_why,
                told: Mapping[str, str] | None = None,
                records: Mapping[str, LoadRecord] | None = None) -> str:
    """One object per device, with every attribute discovery kept; ``told``: device ID ->
    the function a vendor tool says it holds (AWS slots); ``records``: the driver's record
    of what it loaded onto the device, from which image and bytes, for which claim."""
    return json.dumps([_record(d, why_not, (told or {}).get(d.id), (records or {}).get(d.id))
                       for d in devices], indent=2)


def _cells(device: Device, why_not: WhyNot, told: str | None,
           record: LoadRecord | None = None) -> tuple[str, ...]:
    digest = f"sha256 {record.sha256[:16]}..." if record is not None and record.sha256 \
        else None
    return (
        device.id,
        device.backend,
        device.attribute("driver") or NONE,
        ",".join(n.host_path for n in device.nodes) or NONE,
        NONE if device.numa_node is None else str(device.numa_node),
        " ".join(filter(None, (loaded(device), told, digest))) or NONE,
        "no" if why_not(device) else "yes",
        device.health.value,
        device.health_reason or NONE,
    )


def replica_notes(devices: Sequence[Device], replicas: Sequence[ReplicaCount], mode: str,
                  resource_name: str, prefix: str) -> list[str]:
    """One line per resource that ``--replicas`` advertises more than once: how many IDs
    the kubelet will count, so an operator sees the sharing before a pod asks."""
    if not replicas:
        return []
    notes = []
    groups = group_by_resource(DeviceSet.of(devices), mode, resource_name, prefix)
    for name, members in groups.items():
        count = replicas_of(replicas, name)
        if count > 1:
            notes.append(f"{name}: {len(members)} device(s), each advertised {count} times "
                         f"as <ID>::0..{count - 1} ({len(members) * count} IDs)")
    return notes or ["--replicas matches no resource these devices are advertised under"]


def share_notes(devices: Sequence[Device], shares: Sequence[FamilyShare],
                contexts: Mapping[str, int]) -> list[str]:
    """One line per device of a family ``--dra-share`` shares: the contexts it would be
    published shared with while no claim holds it whole (``contexts``: what the driver's
    decision gives), or why it would be published whole, so an operator sees before any
    claim whether ``image`` finds the image it needs."""
    if not sharing_on(tuple(shares)):
        return []
    notes = []
    for device in devices:
        setting = setting_of(tuple(shares), device.backend)
        if setting == 0:
            continue
        given = next(str(s) for s in shares if s.family == device.backend)
        if device.id in contexts:
            notes.append(f"{device.id}: published shared, {contexts[device.id]} contexts "
                         f"({given}), while no claim holds it whole")
        elif held_function(device) is None:
            notes.append(f"{device.id}: published whole ({given}): it holds no function")
        else:
            notes.append(f"{device.id}: published whole ({given}): the image of the function "
                         "it holds is not one this driver loaded there, or serves one user")
    return notes or ["--dra-share matches no device here (only intel ports and alveo cards "
                     "can be shared)"]


def loaded(device: Device) -> str:
    """What runs on the device, in the words of its family."""
    if device.attribute("afu_id"):
        return f"afu {device.attribute('afu_id')}"
    if device.attribute("shell"):
        timestamp = device.attribute("shell_timestamp")
        xclbin = device.attribute("xclbin_uuid")
        return (f"shell {device.attribute('shell')}" + (f" ({timestamp})" if timestamp else "")
                + (f" xclbin {xclbin}" if xclbin else ""))
    if device.attribute("platform") and device.attribute("device"):
        return (f"{device.attribute('platform')} image "
                f"{device.attribute('vendor')}:{device.attribute('device')}")
    return ""


def _record(device: Device, why_not: WhyNot, told: str | None,
            record: LoadRecord | None = None) -> dict[str, object]:
    reason = why_not(device)
    return {
        "id": device.id,
        "backend": device.backend,
        "driver": device.attribute("driver") or None,
        "nodes": [
            {"host_path": n.host_path, "container_path": n.container_path,
             "permissions": n.permissions}
            for n in device.nodes
        ],
        "numa_node": device.numa_node,
        "afu_id": device.attribute("afu_id") or None,
        "shell": device.attribute("shell") or None,
        "xclbin_uuid": device.attribute("xclbin_uuid") or None,
        "agfi_id": told if device.backend == "aws" else None,
        "loaded_by_driver": None if record is None else {
            "image": record.image, "sha256": record.sha256, "claim": record.claim,
            "at": record.at},
        "programmable": reason is None,
        "not_programmable_because": reason,
        "health": device.health.value,
        "health_reason": device.health_reason or None,
        "attributes": device.attrs,
    }
