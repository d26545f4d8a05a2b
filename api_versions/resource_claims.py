"""A ResourceClaim of resource.k8s.io v1, v1beta2 or v1beta1, read into the driver's claim type.

The kubelet's NodePrepareResources names a claim only by namespace, name and UID; the driver
GETs the claim and prepares what ``status.allocation.devices.results[]`` lists for its own
driver name (dra@v0.34 ``kubeletplugin/draplugin.go``). Those results, and the metadata, are
spelt alike in the three versions (k8s.io/api ``resource/{v1,v1beta2,v1beta1}/types.go``:
``DeviceRequestAllocationResult{request, driver, pool, device, ...}``); the versions differ in
the spec, which the driver does not need. So one reader serves all three, and checks the
version it was told against the object's own ``apiVersion``.

A claim without ``status.allocation`` is not allocated (the kubelet should not have asked; the
driver refuses to prepare it). Anything malformed is refused with a ValueError that names the
field, so a bad object is a clear per-claim error rather than a crash or a silent skip.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from api_versions.resource_versions import api_version, check_known
from value_types.claims import (
    AllocationResult,
    ClaimAllocation,
    ClaimRef,
    DeviceConfig,
)

KIND = "ResourceClaim"
RESULT_FIELDS = ("request", "driver", "pool", "device")
CONFIG_SOURCES = ("FromClass", "FromClaim")


class _Reader:
    """Field access that names the path of whatever is wrong."""

    def __init__(self, what: str) -> None:
        self.what = what

    def fail(self, path: str, problem: str) -> ValueError:
        return ValueError(f"{self.what}: {path}: {problem}")

    def mapping(self, value: Any, path: str) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.fail(path, "expected an object" if value is not None else "missing")
        return value

    def optional(self, value: Any, path: str) -> Mapping[str, Any] | None:
        return None if value is None else self.mapping(value, path)

    def text(self, parent: Mapping[str, Any], key: str, path: str) -> str:
        value = parent.get(key)
        if not isinstance(value, str) or not value:
            shown = "missing" if value is None else f"{value!r} is not a non-empty string"
            raise self.fail(f"{path}.{key}" if path else key, shown)
        return value


def claim_ref(version: str, obj: Mapping[str, Any]) -> ClaimRef:
    """The claim's namespace, name and UID, after checking it is a ResourceClaim of ``version``."""
    check_known(version)
    reader = _Reader(f"ResourceClaim ({version})")
    if not isinstance(obj, Mapping):
        raise ValueError(f"ResourceClaim ({version}): expected an object, got "
                         f"{type(obj).__name__}")
    body = obj
    sent_version, kind = body.get("apiVersion"), body.get("kind")
    if sent_version not in (None, "", api_version(version)):
        raise reader.fail("apiVersion", f"{sent_version!r} is not {api_version(version)!r}")
    if kind not in (None, "", KIND):
        raise reader.fail("kind", f"{kind!r} is not {KIND!r}")
    meta = reader.mapping(body.get("metadata"), "metadata")
    return ClaimRef(namespace=reader.text(meta, "namespace", "metadata"),
                    name=reader.text(meta, "name", "metadata"),
                    uid=reader.text(meta, "uid", "metadata"))


def parse_claim(version: str, obj: Mapping[str, Any]) -> ClaimAllocation:
    """``obj`` (a ResourceClaim as the server answered in ``version``) as the driver knows it.

    ``allocated`` only when ``status.allocation`` exists; ``results`` in the server's order,
    every driver's (:meth:`ClaimAllocation.results_for` picks this driver's). Raises
    ValueError naming the field when the object is not a well-formed claim of ``version``.
    """
    ref = claim_ref(version, obj)
    reader = _Reader(f"ResourceClaim {ref.namespace}/{ref.name} ({version})")
    status = reader.optional(obj.get("status"), "status")
    if status is None:
        return ClaimAllocation(ref=ref, allocated=False)
    allocation = reader.optional(status.get("allocation"), "status.allocation")
    if allocation is None:
        return ClaimAllocation(ref=ref, allocated=False)
    devices = reader.optional(allocation.get("devices"), "status.allocation.devices")
    configs = _configs(reader, devices)
    extra = {"classes": request_classes(obj), "reserved_for": reserved_pods(status)}
    entries = devices.get("results") if devices is not None else None
    if entries is None:
        return ClaimAllocation(ref=ref, allocated=True, configs=configs, **extra)
    if not isinstance(entries, list):
        raise reader.fail("status.allocation.devices.results", "expected a list")
    results = []
    for index, entry in enumerate(entries):
        path = f"status.allocation.devices.results[{index}]"
        result = reader.mapping(entry, path)
        values = {key: reader.text(result, key, path) for key in RESULT_FIELDS}
        parts = values["request"].split("/")
        if len(parts) > 2 or not all(parts):
            raise reader.fail(f"{path}.request", f"{values['request']!r} is neither "
                              "<request> nor <request>/<subrequest>")
        results.append(AllocationResult(**values))
    return ClaimAllocation(ref=ref, allocated=True, results=tuple(results), configs=configs,
                           **extra)


def request_classes(obj: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """(request or ``<request>/<subrequest>``, its DeviceClass) from the claim's spec.

    v1 and v1beta2 spell a request's class ``exactly.deviceClassName``, v1beta1
    ``deviceClassName`` on the request itself; every version lists ``firstAvailable[]``
    subrequests with their own ``deviceClassName`` (k8s.io/api ``resource/*/types.go``). The
    spec is immutable and the API server validated it; what is not there is left out, since
    only messages read it."""
    spec = obj.get("spec")
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    found: list[tuple[str, str]] = []
    for request in requests if isinstance(requests, list) else ():
        if not isinstance(request, Mapping) or not isinstance(request.get("name"), str):
            continue
        name = request["name"]
        exactly = request.get("exactly")
        spelt = exactly.get("deviceClassName") if isinstance(exactly, Mapping) \
            else request.get("deviceClassName")
        if isinstance(spelt, str) and spelt:
            found.append((name, spelt))
        for sub in request.get("firstAvailable") or ():
            if isinstance(sub, Mapping) and isinstance(sub.get("name"), str) and \
                    isinstance(sub.get("deviceClassName"), str):
                found.append((f"{name}/{sub['name']}", sub["deviceClassName"]))
    return tuple(found)


def reserved_pods(status: Mapping[str, Any]) -> tuple[str, ...]:
    """The names of the pods ``status.reservedFor[]`` lists (resource ``pods``, core group)."""
    entries = status.get("reservedFor")
    return tuple(entry["name"] for entry in (entries if isinstance(entries, list) else ())
                 if isinstance(entry, Mapping) and entry.get("resource") == "pods"
                 and not entry.get("apiGroup") and isinstance(entry.get("name"), str))


def _configs(reader: _Reader, devices: Mapping[str, Any] | None) -> tuple[DeviceConfig, ...]:
    """``status.allocation.devices.config[]`` (``DeviceAllocationConfiguration``, alike in
    v1, v1beta2 and v1beta1): opaque entries only, as a driver can use no other kind.
    Parameters stay the object the server stored; the driver that owns them checks them."""
    entries = devices.get("config") if devices is not None else None
    if entries is None:
        return ()
    if not isinstance(entries, list):
        raise reader.fail("status.allocation.devices.config", "expected a list")
    configs = []
    for index, entry in enumerate(entries):
        path = f"status.allocation.devices.config[{index}]"
        config = reader.mapping(entry, path)
        source = config.get("source")
        if source not in CONFIG_SOURCES:
            raise reader.fail(f"{path}.source", f"{source!r} is not one of "
                              f"{', '.join(CONFIG_SOURCES)}")
        requests = config.get("requests") or []
        if not isinstance(requests, list) or not all(isinstance(r, str) and r
                                                      for r in requests):
            raise reader.fail(f"{path}.requests", "expected a list of request names")
        opaque = reader.optional(config.get("opaque"), f"{path}.opaque")
        if opaque is None:
            continue
        configs.append(DeviceConfig(source=source, requests=tuple(requests),
                                    driver=reader.text(opaque, "driver", f"{path}.opaque"),
                                    parameters=opaque.get("parameters")))
    return tuple(configs)
