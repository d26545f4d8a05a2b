"""Which extended resource each device is advertised under, and the socket each resource uses.

``single`` mode keeps the b<>com contract: every device under one resource name and one
socket, so existing pod specs keep working. ``afu`` mode gives each loaded function its own
resource, so a pod asks for the function it needs and the scheduler only places it where
that function is loaded: an Intel port's accelerator function unit (``<prefix>/afu-<afu
id>``), an Alveo card's shell (``<prefix>/<VBNV>-<timestamp>``, the names Xilinx's own
plugin gave, so pods written for it keep working with ``--resource-prefix amd.com``).
Reprogramming a card moves it from one resource to another on the next scan.
"""

from __future__ import annotations

import logging
import re

from plugin.model.resource_names import resource_name_problem
from plugin.model.sha256 import sha256_hex
from value_types.devices import Device, DeviceSet

log = logging.getLogger(__name__)

MODES = ("single", "afu")
AFU_PREFIX = "afu-"
MAX_SHORT_NAME = 63
_NOT_NAME = re.compile(r"[^a-z0-9]")
_NOT_SHELL_NAME = re.compile(r"[^A-Za-z0-9_.-]+")
SOCKET_SUFFIX = ".sock"
MAX_SOCKET_SHORT = 40
"""Longest resource part of an afu-mode socket name; a 128-bit AFU ID (36) fits whole."""


def group_by_resource(
    devices: DeviceSet, mode: str, resource_name: str, prefix: str
) -> dict[str, DeviceSet]:
    """Split a node snapshot into one snapshot per resource name, sorted by name.

    ``single``: exactly ``{resource_name: devices}``, even when empty (the resource stays
    registered with zero devices). ``afu``: one entry per AFU ID present; a device without a
    usable AFU ID (none read, or the all-``f`` ID of a crashed port) is in no resource.
    Never raises on device data: a device whose resource name would be invalid (a bad
    ``prefix``, see :func:`prefix_problem`) is left out with a warning. Raises ValueError
    only for an unknown mode, a programming mistake.
    """
    if mode == "single":
        return {resource_name: devices}
    if mode != "afu":
        raise ValueError(f"unknown resource mode {mode!r}; choose one of {', '.join(MODES)}")
    groups: dict[str, list[Device]] = {}
    for device in devices:
        shell = device.attribute("shell")
        afu_id = device.attribute("afu_id")
        try:
            if shell:
                name = shell_resource_name(prefix, shell, device.attribute("shell_timestamp"))
            elif afu_id and set(afu_id.lower()) != {"f"}:
                name = afu_resource_name(prefix, afu_id)
            else:
                log.debug("device %s has no usable AFU ID (%r) or shell; not in any afu "
                          "resource", device.id, afu_id)
                continue
        except ValueError as exc:
            log.warning("device %s (%s) is in no resource: %s", device.id,
                        f"shell {shell}" if shell else f"AFU ID {afu_id}", exc)
            continue
        groups.setdefault(name, []).append(device)
    return {name: DeviceSet.of(groups[name]) for name in sorted(groups)}


def afu_resource_name(prefix: str, afu_id: str) -> str:
    """``<prefix>/afu-<afu id>``, lowercase, only letters and digits in the ID part.

    An ID too long to fit the 63-character name limit is replaced by a digest of it, so
    the name stays valid and still differs from every other AFU's.
    """
    domain = prefix.strip().rstrip("/")
    cleaned = _NOT_NAME.sub("", afu_id.lower())
    if not cleaned or len(AFU_PREFIX) + len(cleaned) > MAX_SHORT_NAME:
        cleaned = "h" + sha256_hex(afu_id.encode())[:40]
    return _checked(prefix, f"{domain}/{AFU_PREFIX}{cleaned}")


def shell_resource_name(prefix: str, shell: str, timestamp: str | None) -> str:
    """``<prefix>/<shell>-<timestamp>``: one resource per shell build, as Xilinx's plugin
    named them (``server.go``, "amd.com/" + VBNV + "-" + timestamp).

    Characters a resource name cannot hold become ``-``; a name longer than 63 characters
    keeps a readable head and ends in a digest of the whole, so it stays unique.
    """
    domain = prefix.strip().rstrip("/")
    whole = f"{shell}-{timestamp}" if timestamp else shell
    short = _NOT_SHELL_NAME.sub("-", whole).strip("-_.")
    if len(short) > MAX_SHORT_NAME:
        digest = sha256_hex(whole.encode())[:16]
        short = f"{short[:MAX_SHORT_NAME - 17].rstrip('-_.')}-{digest}"
    if not short:
        short = "shell-h" + sha256_hex(whole.encode())[:40]
    return _checked(prefix, f"{domain}/{short}")


def _checked(prefix: str, name: str) -> str:
    """``name``, or ValueError blaming ``--resource-prefix``: the ID part is always valid."""
    problem = resource_name_problem(name)
    if problem:
        raise ValueError(f"--resource-prefix {prefix!r} gives invalid resource names: {problem}")
    return name


def prefix_problem(prefix: str) -> str | None:
    """Why ``prefix`` cannot start afu-mode resource names, or None; for start-up checks."""
    try:
        afu_resource_name(prefix, "0")
    except ValueError as exc:
        return str(exc)
    return None


def socket_name_for(resource_name: str, base_socket: str, mode: str) -> str:
    """The socket file of one resource in the device-plugin directory.

    ``single``: ``base_socket`` itself (b<>com compatible). ``afu``: the base name with the
    resource's short name inserted, ``accelerator.sock`` -> ``accelerator-afu-<id>.sock``,
    distinct for every resource of one prefix and never ``kubelet.sock``.
    """
    if mode == "single":
        return base_socket
    if mode != "afu":
        raise ValueError(f"unknown resource mode {mode!r}; choose one of {', '.join(MODES)}")
    stem = base_socket.removesuffix(SOCKET_SUFFIX) or "accelerator"
    short = resource_name.rsplit("/", 1)[-1]
    short = re.sub(r"[^A-Za-z0-9_.-]", "-", short) or "resource"
    if len(short) > MAX_SOCKET_SHORT:
        # Unix socket paths are short (107 bytes): keep a readable head and a digest.
        digest = sha256_hex(short.encode())[:16]
        short = f"{short[:MAX_SOCKET_SHORT - 17]}-{digest}"
    return f"{stem}-{short}{SOCKET_SUFFIX}"


def longest_socket_name(base_socket: str, mode: str, prefix: str) -> str:
    """The longest socket file name this mode can use, for the start-up length check."""
    if mode != "afu":
        return base_socket
    return socket_name_for(f"{prefix}/{'a' * MAX_SHORT_NAME}", base_socket, mode)
