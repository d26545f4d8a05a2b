"""The parts of a Kubernetes object the slice publisher reads and writes, and nothing more.

The publisher keeps the API server's ResourceSlices in line with the node's devices without
knowing how a slice is spelled in any resource.k8s.io version: it needs an object's name and
resourceVersion and the pool generation it was published under (whether the server kept the
taints is :func:`api_versions.resource_slices.dropped_taints`). Those few field paths live
here, beside the shapes that build the objects, so no JSON field name leaks into ``plugin/``.
"""

from __future__ import annotations

import copy
from typing import Any

KubeObject = dict[str, Any]


def api_version_of(obj: KubeObject) -> str:
    """The version part of ``apiVersion`` (``resource.k8s.io/v1beta1`` -> ``v1beta1``)."""
    return str(obj.get("apiVersion", "")).rpartition("/")[2]


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


def labels_of(obj: KubeObject) -> dict[str, str]:
    """``metadata.labels`` (a Namespace's grants), string values only."""
    labels = obj.get("metadata", {}).get("labels")
    return {str(k): v for k, v in labels.items() if isinstance(v, str)} \
        if isinstance(labels, dict) else {}


def data_keys_of(obj: KubeObject) -> list[str]:
    """The keys of a ConfigMap's ``data`` (the function catalogue's class names)."""
    data = obj.get("data")
    return sorted(str(k) for k in data) if isinstance(data, dict) else []
