"""Which resource name each device is advertised under, and on which socket.

``single`` (the default, b<>com compatible): every device under one name. ``afu``: one
resource per AFU ID, so a pod can ask for the accelerator function it needs rather than for
any FPGA; a port reprogrammed with another AFU moves to another resource on the next scan.
"""

from __future__ import annotations

import logging
import re

from plugin.model import DeviceSet
from plugin.resource_names import resource_name_problem

log = logging.getLogger(__name__)

AFU_ATTRIBUTE = "afu_id"
_NOT_NAME_CHARS = re.compile(r"[^a-z0-9]+")


def afu_resource_name(prefix: str, afu_id: str) -> str:
    """``<prefix>/afu-<AFU ID in lowercase hex>``, valid as an extended resource name.

    AFU IDs are 128-bit values, written with or without dashes; both spellings map to the
    same 32 hex digits, so the name does not depend on how a driver prints the ID.
    """
    compact = _NOT_NAME_CHARS.sub("", afu_id.lower())
    name = f"{prefix}/afu-{compact[:59]}"
    problem = resource_name_problem(name)
    if problem:
        raise ValueError(problem)
    return name


def group_by_resource(
    devices: DeviceSet, mode: str, resource_name: str, prefix: str
) -> dict[str, DeviceSet]:
    """Split a node snapshot into per-resource snapshots (see the module docstring)."""
    if mode == "single":
        return {resource_name: devices}
    if mode != "afu":
        raise ValueError(f"unknown resource mode {mode!r}")
    groups: dict[str, list] = {}
    for device in devices:
        afu_id = device.attribute(AFU_ATTRIBUTE)
        if not afu_id:
            log.debug("device %s has no AFU ID; not advertised in afu mode", device.id)
            continue
        try:
            name = afu_resource_name(prefix, afu_id)
        except ValueError as exc:
            log.warning("device %s: cannot name a resource after AFU ID %r: %s",
                        device.id, afu_id, exc)
            continue
        groups.setdefault(name, []).append(device)
    return {name: DeviceSet.of(members) for name, members in sorted(groups.items())}


def socket_name_for(resource_name: str, base_socket: str, mode: str) -> str:
    """The socket file of ``resource_name``: the base name in single mode, one per AFU else."""
    if mode == "single":
        return base_socket
    stem = base_socket.removesuffix(".sock")
    short = resource_name.split("/", 1)[1]
    return f"{stem}-{short}.sock"
