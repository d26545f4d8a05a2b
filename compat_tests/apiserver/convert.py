"""Conversion between the served versions and the one stored (hub) form, which is v1.

A real server stores every object once, in its storage version, and converts on the way in and
out, so a slice written as v1beta1 reads back as v1 and the reverse. v1beta2 has the v1 shape.
v1beta1 differs in two places (k/k ``pkg/apis/resource/v1beta1/conversion.go``):

- each device's fields sit under ``basic: {attributes, capacity, taints, ...}``; v1 and v1beta2
  put them on the device itself. Converting v1 to v1beta1 always writes ``basic`` (maybe ``{}``);
- a claim request's ``deviceClassName, selectors, allocationMode, count, adminAccess,
  tolerations, capacity`` sit on the request; v1 nests them under ``exactly``, created only when
  one of them is set ("" and 0 count as unset);
- ``spec.nodeName`` and ``spec.allNodes`` are plain string and bool in v1beta1, so ``""`` and
  ``false`` there mean unset in v1.
"""

from __future__ import annotations

import copy
from typing import Any

HUB = "v1"
GROUP = "resource.k8s.io"
_EXACT_FIELDS = ("deviceClassName", "selectors", "allocationMode", "count", "adminAccess",
                 "tolerations", "capacity")


def api_version(version: str) -> str:
    return f"{GROUP}/{version}"


def _is_set(key: str, value: Any) -> bool:
    if key == "deviceClassName" or key == "allocationMode":
        return value not in ("", None)
    if key == "count":
        return value not in (0, None)
    return value is not None


def _requests(claim_spec: dict[str, Any]) -> list[dict[str, Any]]:
    devices = claim_spec.get("devices")
    if not isinstance(devices, dict):
        return []
    requests = devices.get("requests")
    return [r for r in requests if isinstance(r, dict)] if isinstance(requests, list) else []


def _devices(spec: dict[str, Any]) -> list[dict[str, Any]]:
    devices = spec.get("devices")
    return [d for d in devices if isinstance(d, dict)] if isinstance(devices, list) else []


def _slice_to_hub(spec: dict[str, Any]) -> None:
    if spec.get("nodeName") == "":
        del spec["nodeName"]
    if spec.get("allNodes") is False:
        del spec["allNodes"]
    for device in _devices(spec):
        basic = device.pop("basic", None)
        if isinstance(basic, dict):
            device.update(basic)


def _slice_from_hub(spec: dict[str, Any]) -> None:
    for device in _devices(spec):
        basic = {k: device.pop(k) for k in list(device) if k != "name"}
        device["basic"] = basic


def _claim_spec_to_hub(spec: dict[str, Any]) -> None:
    for request in _requests(spec):
        exact = {k: request.pop(k) for k in _EXACT_FIELDS if k in request}
        if any(_is_set(k, v) for k, v in exact.items()):
            request["exactly"] = exact


def _claim_spec_from_hub(spec: dict[str, Any]) -> None:
    for request in _requests(spec):
        exact = request.pop("exactly", None)
        if isinstance(exact, dict):
            request.update(exact)


def to_hub(resource: str, version: str, obj: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``obj`` (written as ``version``) in the stored v1 shape."""
    out = copy.deepcopy(obj)
    out["apiVersion"] = api_version(HUB)
    spec = out.get("spec")
    if version == "v1beta1" and isinstance(spec, dict):
        if resource == "resourceslices":
            _slice_to_hub(spec)
        elif resource == "resourceclaims":
            _claim_spec_to_hub(spec)
    return out


def from_hub(resource: str, version: str, obj: dict[str, Any]) -> dict[str, Any]:
    """A copy of stored ``obj`` as a client of ``version`` reads it."""
    out = copy.deepcopy(obj)
    out["apiVersion"] = api_version(version)
    spec = out.get("spec")
    if version == "v1beta1" and isinstance(spec, dict):
        if resource == "resourceslices":
            _slice_from_hub(spec)
        elif resource == "resourceclaims":
            _claim_spec_from_hub(spec)
    return out
