"""The REST resources the emulator serves and their fixed facts (scope, kind, field selectors).

Field selectors per kind come from the field label conversion functions: ResourceSlice accepts
``metadata.name``, ``spec.nodeName``, ``spec.driver`` (k/k ``pkg/apis/resource/v1/conversion.go``);
other kinds the defaults ``metadata.name`` and ``metadata.namespace``.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from typing import Any

from compat_tests.apiserver.models import GROUP

VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
STATUS_VERBS = ("get", "patch", "update")


@dataclass(frozen=True)
class ResourceInfo:
    name: str
    singular: str
    kind: str
    namespaced: bool
    group: str
    field_labels: tuple[str, ...]
    status: bool = False
    short_names: tuple[str, ...] = ()

    def field_value(self, obj: dict[str, Any], label: str) -> str:
        meta = obj.get("metadata", {})
        if label == "metadata.name":
            return str(meta.get("name", ""))
        if label == "metadata.namespace":
            return str(meta.get("namespace", ""))
        spec = obj.get("spec", {})
        return str(spec.get(label.split(".", 1)[1]) or "")

    def list_kind(self) -> str:
        return f"{self.kind}List"


RESOURCES: dict[str, ResourceInfo] = {
    "resourceslices": ResourceInfo(
        "resourceslices", "resourceslice", "ResourceSlice", False, GROUP,
        ("metadata.name", "spec.nodeName", "spec.driver")),
    "resourceclaims": ResourceInfo(
        "resourceclaims", "resourceclaim", "ResourceClaim", True, GROUP,
        ("metadata.name", "metadata.namespace"), status=True),
    "deviceclasses": ResourceInfo(
        "deviceclasses", "deviceclass", "DeviceClass", False, GROUP,
        ("metadata.name",)),
}

NODES = ResourceInfo("nodes", "node", "Node", False, "", ("metadata.name", "spec.unschedulable"),
                     status=True, short_names=("no",))


def storage_version_hash(group: str, version: str, kind: str) -> str:
    """apiserver ``storageversionhash``: base64 of the first 8 bytes of sha256(GVK string)."""
    gvk = f"{group}/{version}, Kind={kind}" if group else f"{version}, Kind={kind}"
    return base64.b64encode(hashlib.sha256(gvk.encode()).digest()[:8]).decode()


def field_label_error(info: ResourceInfo, version: str, label: str) -> str:
    """The server's message for a field selector it cannot serve."""
    if info.name == "resourceslices":
        return f"field label not supported for {GROUP}/{version}, Kind={info.kind}: {label}"
    if info.name == "nodes":
        return f"field label not supported: {label}"
    return f'"{label}" is not a known field selector: only "metadata.name", "metadata.namespace"'
