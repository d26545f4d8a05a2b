"""Container Device Interface specs: each resource's devices, as a container runtime reads them.

With ``--cdi`` the plugin writes one CDI spec per resource into ``--cdi-spec-dir`` and names
the allocated devices in ``ContainerAllocateResponse.cdi_devices`` (kubelets 1.28+); the
runtime (containerd 1.7+, CRI-O 1.23+ with CDI enabled) then injects the device nodes from
the spec. Off by default: a runtime without CDI enabled fails to start a container whose
devices are only named that way, and kubelets before 1.28 ignore the field.

Facts from the CDI specification (``cncf-tags/container-device-interface``: SPEC.md,
``pkg/parser/parser.go`` which runtimes validate names with, ``specs-go/version.go`` which
they check ``cdiVersion`` with; spec 1.1.0, tag v1.1.0):

* ``kind`` is ``<vendor>/<class>``. SPEC.md asks for a DNS-subdomain vendor and a class of
  at most 63 alphanumerics, ``-``, ``_`` and ``.``, starting and ending alphanumeric; the
  parser is stricter: vendor and class must both start with a *letter*. A dot in the class
  needs spec 0.6.0, which runtimes on a CDI library older than v0.6.0 refuse (podman 4.3.1
  to 4.x, CRI-O 1.26 and 1.27, containerd 1.7.0 to 1.7.11: ``unresolvable CDI devices``).
  A Kubernetes extended resource name obeys the SPEC.md rules but may start either segment
  with a digit and hold dots in its name part (``example.com/fpga.v2``, or an afu-mode name
  built from a dotted Alveo shell), so a resource's kind is its name except for such a
  segment, which becomes ``x<digest>-<segment>`` with every dot as ``-`` (cut to 63): the
  digest of the whole segment keeps two resources from ever sharing a kind. The kind need
  not equal the resource name; the kubelet passes whatever Allocate names.
* Device names are alphanumerics, ``-``, ``_`` and ``.``, starting and ending alphanumeric
  (starting with a digit since 0.5.0). The Go parser also takes ``:`` inside a name, SPEC.md
  does not; names keep to SPEC.md so any implementation reads them, and PCI addresses are
  spelled with ``-`` (``0000:5e:00.0`` -> ``0000-5e-00.0``); any other stray character, or a
  clash, gets a digest.
* ``cdiVersion`` is the lowest version whose features the spec uses, as ``version.go``
  computes it: a runtime refuses a spec whose declared version is lower than that, and one
  built before a version was released refuses the version itself, so declaring the lowest
  keeps the most runtimes able to read the spec. Of what this plugin writes, 0.5.0 brings
  device-node ``hostPath`` and device names starting with a digit (every ID of every
  backend); nothing else written needs more than 0.3.0, the first tagged spec. Every spec
  therefore stays at 0.5.0, which every runtime on a CDI library since v0.5.0 reads.
* A device whose edits are empty makes the CDI library refuse the whole spec (``invalid
  device, empty device edits``, in every release): a device with nothing to inject (a units
  ID, an AWS slot with no driver bound) is left out of the spec and never named in
  ``cdi_devices``; its container still gets its environment from Allocate.

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

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plugin.process.files import replace_atomically
from value_types.devices import Device, DeviceSet

log = logging.getLogger(__name__)

STRATEGIES = ("device-specs", "cdi", "both")
"""What v1beta1 Allocate names devices with when --cdi is on: DeviceSpecs only (CDI specs
still written, for other tools), CDI names only, or both (the default, for kubelets < 1.28)."""
_NOT_NAME = re.compile(r"[^A-Za-z0-9_.-]")
_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_SEGMENT = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
"""A vendor as the CDI parser accepts it: a letter first (see the module docstring)."""
_CLASS = re.compile(r"^[A-Za-z]([A-Za-z0-9_-]*[A-Za-z0-9])?$")
"""A class the parser accepts without raising the spec to 0.6.0: a letter first, no dot."""
_NOT_CLASS = re.compile(r"[^A-Za-z0-9_-]")
_CLASS_MAX = 63


@dataclass(frozen=True)
class CdiPolicy:
    """What Allocate says about devices when CDI is on (None on the resource: CDI off)."""

    kind: str
    names: dict[str, str]
    """Device ID -> CDI device name, for the devices of the current spec."""
    device_specs: bool
    """Whether DeviceSpecs still go out (strategies ``both`` and ``device-specs``)."""
    cdi_devices: bool
    """Whether devices are named in ``cdi_devices`` (strategies ``both`` and ``cdi``)."""

    @classmethod
    def of(cls, resource: str, devices: DeviceSet, strategy: str) -> CdiPolicy:
        """The names the spec written for ``devices`` of ``resource`` gives them (only the
        devices in it), and what ``--device-list-strategy`` lets Allocate send."""
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown device list strategy {strategy!r}")
        return cls(kind_of(resource), device_names(injectable(devices)),
                   device_specs=strategy != "cdi", cdi_devices=strategy != "device-specs")

    def qualified(self, device_ids: tuple[str, ...] | list[str]) -> list[str]:
        """``<kind>=<name>`` of each ID the spec holds, as the kubelet passes them to the
        runtime; none when the strategy keeps to DeviceSpecs. An ID the spec leaves out
        (nothing to inject) is not named: the runtime could not resolve it."""
        if not self.cdi_devices:
            return []
        return [f"{self.kind}={self.names[i]}" for i in device_ids if i in self.names]


def kind_of(resource: str) -> str:
    """The CDI kind of a resource: its name, with a segment the CDI parser refuses, or a
    class that would need spec 0.6.0, replaced by ``x<digest>-<segment>`` so that it starts
    with a letter, holds no dot in the class and stays unique."""
    vendor, _, cls = resource.partition("/")
    return (f"{_segment(vendor, _SEGMENT, _NOT_NAME, limit=253)}/"
            f"{_segment(cls, _CLASS, _NOT_CLASS, limit=_CLASS_MAX)}")


def _segment(text: str, valid: re.Pattern[str], invalid: re.Pattern[str], *, limit: int) -> str:
    if len(text) <= limit and valid.match(text):
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    rest = invalid.sub("-", text)[: limit - len(digest) - 2].rstrip("-_.")
    return f"x{digest}-{rest}" if rest else f"x{digest}"


def minimum_version(content: dict[str, Any]) -> str:
    """The lowest ``cdiVersion`` the spec's fields need, by the rules of the CDI
    specification's ``specs-go/version.go`` for the fields this module writes."""
    _, _, cls = content["kind"].partition("/")
    if "." in cls:
        return "0.6.0"
    devices = content["devices"]
    if any(d["name"][:1].isdigit() for d in devices) or any(
            "hostPath" in n for d in devices for n in d["containerEdits"].get("deviceNodes", ())):
        return "0.5.0"
    if any("type" in m for d in devices for m in d["containerEdits"].get("mounts", ())):
        return "0.4.0"
    return "0.3.0"


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


def injectable(devices: DeviceSet) -> DeviceSet:
    """The devices a runtime has something to inject for (see the module docstring)."""
    return DeviceSet.of(d for d in devices if d.nodes or d.mounts)


def spec(resource: str, devices: DeviceSet) -> dict[str, Any] | None:
    """The CDI spec of one resource; None when no device has anything to inject (a spec
    needs a device, and a device needs edits)."""
    devices = injectable(devices)
    if len(devices) == 0:
        return None
    names = device_names(devices)
    content: dict[str, Any] = {
        "kind": kind_of(resource),
        "devices": [{"name": names[d.id], "containerEdits": _edits(d)} for d in devices],
    }
    return {"cdiVersion": minimum_version(content), **content}


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
    """``<vendor>_<class>.json``. The CDI library's own convention (``GenerateSpecName``) is
    ``<vendor>-<class>``, but a vendor may hold ``-`` (``b-com.com``), so two kinds could
    share a file; a vendor never holds ``_`` (a DNS subdomain), so this spelling cannot."""
    vendor, _, cls = kind.partition("/")
    return f"{vendor}_{cls}.json"


class SpecWriter:
    """Keeps ``directory`` holding exactly the specs of the resources being served."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._written: dict[str, str] = {}
        """Resource name -> the spec text last written for it."""
        self._reported: set[str] = set()

    def write(self, resource: str, devices: DeviceSet) -> bool:
        """Make the resource's spec on disk describe ``devices``; True when it does (so
        Allocate may name them), False when the directory refused the file."""
        content = spec(resource, devices)
        if content is None:
            self.remove(resource)
            return False
        text = json.dumps(content, indent=2, sort_keys=True) + "\n"
        if self._written.get(resource) == text:
            return True
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            replace_atomically(self.directory / spec_file_name(content["kind"]), text)
        except OSError as exc:
            self._written.pop(resource, None)
            self._report(f"cannot write the CDI spec of {resource} into {self.directory}: "
                         f"{exc.strerror or exc}; Allocate names its devices in DeviceSpecs "
                         "only until the spec can be written")
            return False
        self._written[resource] = text
        self._reported.clear()
        return True

    def remove(self, resource: str) -> None:
        """Take the resource's spec away (the resource is gone or the plugin stops)."""
        self._written.pop(resource, None)
        try:
            (self.directory / spec_file_name(kind_of(resource))).unlink(missing_ok=True)
        except OSError as exc:
            self._report(f"cannot remove the CDI spec of {resource}: {exc.strerror or exc}")

    def remove_all(self) -> None:
        """Remove every spec this writer wrote."""
        for resource in list(self._written):
            self.remove(resource)

    def _report(self, message: str) -> None:
        """Log a problem once: a scan every few seconds must not repeat it."""
        if message not in self._reported:
            self._reported.add(message)
            log.error("%s", message)
