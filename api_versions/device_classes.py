"""What a DeviceClass tells the driver: which extended resource names it lets DRA serve.

KEP-5004: a DeviceClass with ``spec.extendedResourceName`` lets pods that ask for that name
(``b-com.com/accelerator: 1``) be served by DRA on nodes where no device plugin advertises
it. Without such a class, pods asking by name would find nothing on a DRA node, so ``--api
auto`` serves DRA only where one maps every resource the node has. v1, v1beta2 and v1beta1
spell the field alike (an API server with the DRAExtendedResource gate off drops it, which
reads here as no mapping, as it should).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def extended_resource_names(classes: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Extended resource name -> the DeviceClass that maps it."""
    mapped: dict[str, str] = {}
    for obj in classes:
        spec = obj.get("spec")
        name = spec.get("extendedResourceName") if isinstance(spec, Mapping) else None
        if isinstance(name, str) and name:
            mapped.setdefault(name, str(obj.get("metadata", {}).get("name", "")))
    return mapped


def driver_configs(classes: Iterable[Mapping[str, Any]], driver: str) -> dict[str, list[Any]]:
    """DeviceClass name -> the opaque ``parameters`` of its ``spec.config`` entries for
    ``driver``, in order (v1, v1beta2 and v1beta1 spell them alike). What a class
    configuration copied into an allocation with no request names is matched against, to
    tell which requests it is for (:mod:`plugin.programming.function_config`)."""
    found: dict[str, list[Any]] = {}
    for obj in classes:
        name = obj.get("metadata", {}).get("name")
        spec = obj.get("spec")
        if not isinstance(name, str) or not isinstance(spec, Mapping):
            continue
        entries = spec.get("config")
        found[name] = [entry["opaque"].get("parameters") for entry in (
            entries if isinstance(entries, list) else [])
            if isinstance(entry, Mapping) and isinstance(entry.get("opaque"), Mapping)
            and entry["opaque"].get("driver") == driver]
    return found
