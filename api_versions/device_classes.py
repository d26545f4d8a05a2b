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
