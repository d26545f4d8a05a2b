"""Container Device Interface specs: each resource's devices, as a container runtime reads them.

With ``--cdi`` the plugin writes one CDI spec per resource into ``--cdi-spec-dir`` and names
the allocated devices in ``ContainerAllocateResponse.cdi_devices`` (kubelets 1.28+); the
runtime (containerd 1.7+, CRI-O 1.23+ with CDI enabled) then injects the device nodes from
the spec. Off by default: a runtime without CDI enabled fails to start a container whose
devices are only named that way, and kubelets before 1.28 ignore the field.

Facts from the CDI specification (``cncf-tags/container-device-interface``, SPEC.md, spec
1.1.0):

* ``kind`` is ``<prefix>/<name>``, the prefix a DNS subdomain and the name at most 63
  alphanumerics, ``-``, ``_`` and ``.``, starting and ending alphanumeric; a Kubernetes
  extended resource name obeys the same rules, so a resource's kind is its name.
* Device names are alphanumerics, ``-``, ``_`` and ``.``, starting and ending alphanumeric
  (starting with a digit since 0.5.0); PCI addresses hold ``:``, so IDs are spelled with
  ``-`` there (``0000:5e:00.0`` -> ``0000-5e-00.0``), with a digest where that would clash.
* ``cdiVersion`` is the lowest the spec uses: 0.5.0 for ``hostPath`` on device nodes and
  names starting with a digit, 0.6.0 once the kind's name holds a dot. A runtime refuses a
  spec declaring a version lower than the fields it uses need.

The device edits carry device nodes and mounts only. The environment a container gets
(``ACCELERATOR_UNITS``, the comma-joined IDs of its whole allocation) stays in Allocate's
``envs``: CDI appends each injected device's ``env`` entries, so a per-device variable would
appear once per device with a different value, and which one wins is up to the runtime.

Specs are written atomically (a temporary file in the same directory, fsync, rename), so a
runtime never reads half a spec; rewritten only when they change; removed when a resource
goes and when the plugin stops. A directory that cannot be written is logged once per
problem and never stops device serving.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plugin.model import Device, DeviceSet

log = logging.getLogger(__name__)

DEFAULT_SPEC_DIR = Path("/var/run/cdi")
STRATEGIES = ("device-specs", "cdi", "both")
"""What v1beta1 Allocate names devices with when --cdi is on: DeviceSpecs only (CDI specs
still written, for other tools), CDI names only, or both (the default, for kubelets < 1.28)."""
BASE_VERSION = "0.5.0"
DOTTED_KIND_VERSION = "0.6.0"
_NOT_NAME = re.compile(r"[^A-Za-z0-9_.-]")
_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")


@dataclass(frozen=True)
class CdiPolicy:
    """What Allocate says about devices when CDI is on (None on the resource: CDI off)."""

    kind: str
    names: dict[str, str]
    """Device ID -> CDI device name, for the devices of the current spec."""
    device_specs: bool

    def qualified(self, device_ids: tuple[str, ...] | list[str]) -> list[str]:
        """``<kind>=<name>`` of each ID, as the kubelet passes them to the runtime."""
        return [f"{self.kind}={self.names.get(i) or device_name(i)}" for i in device_ids]


def device_name(device_id: str) -> str:
    """A device ID spelled as a CDI device name (see the module docstring)."""
    plain = device_id.replace(":", "-")
    if len(plain) <= 128 and _NAME.match(plain):
        return plain
    digest = hashlib.sha256(device_id.encode()).hexdigest()[:12]
    name = _NOT_NAME.sub("-", device_id).strip("-_.")[:40].rstrip("-_.")
    return f"{name}-{digest}" if name else f"d{digest}"


def device_names(devices: DeviceSet) -> dict[str, str]:
    """Every device's CDI name, unique within the set (a clash gets a digest)."""
    names: dict[str, str] = {}
    taken: set[str] = set()
    for device in devices:
        name = device_name(device.id)
        if name in taken:
            name = f"{name}-{hashlib.sha256(device.id.encode()).hexdigest()[:12]}"
        names[device.id] = name
        taken.add(name)
    return names


def spec(kind: str, devices: DeviceSet) -> dict[str, Any] | None:
    """The CDI spec of one resource; None when it has no device (a spec needs one)."""
    if len(devices) == 0:
        return None
    names = device_names(devices)
    version = DOTTED_KIND_VERSION if "." in kind.split("/", 1)[-1] else BASE_VERSION
    return {
        "cdiVersion": version,
        "kind": kind,
        "devices": [{"name": names[d.id], "containerEdits": _edits(d)} for d in devices],
    }


def _edits(device: Device) -> dict[str, Any]:
    edits: dict[str, Any] = {}
    if device.nodes:
        edits["deviceNodes"] = [
            {"path": n.container_path, "hostPath": n.host_path, "permissions": n.permissions}
            for n in device.nodes]
    if device.mounts:
        edits["mounts"] = [
            {"hostPath": m.host_path, "containerPath": m.container_path,
             "options": ["rbind", "ro" if m.read_only else "rw"]}
            for m in device.mounts]
    return edits


def spec_file_name(kind: str) -> str:
    """``<prefix>_<name>.json``: ``_`` cannot occur in the prefix, so names never clash."""
    prefix, _, name = kind.partition("/")
    return f"{prefix}_{name}.json"


class SpecWriter:
    """Keeps ``directory`` holding exactly the specs of the resources being served."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._written: dict[str, str] = {}
        """Kind -> the content last written."""
        self._reported: set[str] = set()

    def write(self, kind: str, devices: DeviceSet) -> None:
        content = spec(kind, devices)
        if content is None:
            self.remove(kind)
            return
        text = json.dumps(content, indent=2, sort_keys=True) + "\n"
        if self._written.get(kind) == text:
            return
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            _replace_atomically(self.directory / spec_file_name(kind), text)
        except OSError as exc:
            self._report(f"cannot write the CDI spec of {kind} into {self.directory}: "
                         f"{exc.strerror or exc}; containers get DeviceSpecs only if "
                         "--device-list-strategy keeps them")
            return
        self._written[kind] = text
        self._reported.clear()

    def remove(self, kind: str) -> None:
        self._written.pop(kind, None)
        try:
            (self.directory / spec_file_name(kind)).unlink(missing_ok=True)
        except OSError as exc:
            self._report(f"cannot remove the CDI spec of {kind}: {exc.strerror or exc}")

    def remove_all(self) -> None:
        for kind in list(self._written):
            self.remove(kind)

    def _report(self, message: str) -> None:
        if message not in self._reported:
            self._reported.add(message)
            log.error("%s", message)


def _replace_atomically(path: Path, text: str) -> None:
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
