"""What a container runtime's CDI library checks in a spec, for the tests of both suites.

Structure: ``tests/data/cdi-spec-1.1.0.schema.json``, a JSON schema written for this project
from the CDI specification's text (its header names the release). The rules on names and
versions that runtimes enforce are written out here from the same release of
``cncf-tags/container-device-interface``: the parser's (vendor and class start with a
letter; device names per SPEC.md, without ``:``) and its minimum-version logic (the declared
``cdiVersion`` must be known and at least what the fields used need).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema

SCHEMA = Path(__file__).parent / "data" / "cdi-spec-1.1.0.schema.json"
KNOWN_VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")
_VENDOR_OR_CLASS = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_DEVICE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


VALIDATOR = jsonschema.Draft7Validator(json.loads(SCHEMA.read_text()))


def required_version(spec: dict[str, Any]) -> str:
    """version.go's minimum for the fields a device plugin can write (no annotations, RDT,
    GIDs or net devices, which the plugin never writes)."""
    _, _, cls = spec["kind"].partition("/")
    if "." in cls:
        return "0.6.0"
    devices = spec["devices"]
    edits = [d.get("containerEdits", {}) for d in devices] + [spec.get("containerEdits", {})]
    if any(d["name"][:1].isdigit() for d in devices) or any(
            n.get("hostPath") for e in edits for n in e.get("deviceNodes", ())):
        return "0.5.0"
    if any(m.get("type") for e in edits for m in e.get("mounts", ())):
        return "0.4.0"
    return "0.3.0"


def check(spec: dict[str, Any]) -> None:
    """Raise AssertionError (or jsonschema's error) where a runtime would refuse ``spec``."""
    VALIDATOR.validate(spec)
    assert set(spec) <= {"cdiVersion", "kind", "devices", "containerEdits", "annotations"}
    assert spec["cdiVersion"] in KNOWN_VERSIONS, spec["cdiVersion"]
    assert KNOWN_VERSIONS.index(spec["cdiVersion"]) >= KNOWN_VERSIONS.index(
        required_version(spec)), f"{spec['cdiVersion']} < {required_version(spec)}"
    vendor, slash, cls = spec["kind"].partition("/")
    assert slash and _VENDOR_OR_CLASS.match(vendor) and _VENDOR_OR_CLASS.match(cls), spec["kind"]
    assert len(vendor) <= 253 and all(_DNS_LABEL.match(p) for p in vendor.split(".")), vendor
    assert len(cls) <= 63, cls
    names = [d["name"] for d in spec["devices"]]
    assert names and len(set(names)) == len(names), "device names present and unique"
    for device in spec["devices"]:  # device.go: "invalid device, empty device edits"
        edits = device.get("containerEdits", {})
        assert any(edits.get(k) for k in ("env", "deviceNodes", "hooks", "mounts")), \
            f"{device['name']}: a device with empty edits makes the runtime refuse the spec"
    for name in names:
        assert _DEVICE.match(name), name
