"""The parts of a Kubernetes object the slice publisher reads and writes, and nothing more.

The publisher keeps the API server's ResourceSlices in line with the node's devices without
knowing how a slice is spelled in any resource.k8s.io version: it needs an object's name and
resourceVersion, the pool generation it was published under, and whether the server kept the
device taints it was sent. Those few field paths live here, beside the shapes that build the
objects, so no JSON field name leaks into ``plugin/``.
"""

from __future__ import annotations

import copy
from typing import Any

KubeObject = dict[str, Any]


def name_of(obj: KubeObject) -> str:
    return str(obj.get("metadata", {}).get("name", ""))


def resource_version_of(obj: KubeObject) -> str:
    return str(obj.get("metadata", {}).get("resourceVersion", ""))


def as_replacement(obj: KubeObject, name: str, resource_version: str) -> KubeObject:
    """``obj`` made to replace the stored object ``name`` at ``resource_version`` (PUT):
    the server refuses it with 409 if the object changed since."""
    replacement = copy.deepcopy(obj)
    metadata = replacement.setdefault("metadata", {})
    metadata.pop("generateName", None)
    metadata["name"] = name
    metadata["resourceVersion"] = resource_version
    return replacement


def pool_generation_of(obj: KubeObject) -> int:
    """``spec.pool.generation`` of a ResourceSlice (every version spells it alike); 0 if
    absent or not a number."""
    value = obj.get("spec", {}).get("pool", {}).get("generation", 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _device_taints(device: dict[str, Any]) -> list[Any]:
    """A device's taints, flat (v1, v1beta2) or under ``basic`` (v1beta1)."""
    basic = device.get("basic")
    holder = basic if isinstance(basic, dict) else device
    taints = holder.get("taints") or []
    return taints if isinstance(taints, list) else []


def sent_taints(obj: KubeObject) -> bool:
    """Whether any device of the slice carries a taint."""
    return any(_device_taints(d) for d in obj.get("spec", {}).get("devices", []) or [])


def taints_kept(sent: KubeObject, stored: KubeObject) -> bool:
    """Whether the server kept the taints of ``sent`` in what it stored. A server with the
    DRADeviceTaints gate off drops the field without a word; the answer tells."""
    return not sent_taints(sent) or sent_taints(stored)
