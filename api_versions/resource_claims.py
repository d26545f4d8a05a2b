"""A ResourceClaim of resource.k8s.io v1, v1beta2 or v1beta1, read into the driver's claim type.

The kubelet's NodePrepareResources names a claim only by namespace, name and UID; the driver
GETs the claim and prepares what ``status.allocation.devices.results[]`` lists for its own
driver name (dra@v0.34 ``kubeletplugin/draplugin.go``). Those results, and the metadata, are
spelt alike in the three versions (k8s.io/api ``resource/{v1,v1beta2,v1beta1}/types.go``:
``DeviceRequestAllocationResult{request, driver, pool, device, ...}``); the versions differ in
the spec, which the driver does not need. So one reader serves all three, and checks the
version it was told against the object's own ``apiVersion``.

A result may be one share of a device published with ``allowMultipleAllocations``
(KEP-5075, resource.k8s.io v1, v1beta2 and v1beta1 alike from 1.34): ``shareID`` (a
``types.UID``: the scheduler writes a random UUID, and the API server accepts only the
RFC 4122 lower-case form, k/k ``validateDeviceRequestAllocationResult``) and
``consumedCapacity`` (capacity name -> quantity). The driver reads its own ``contexts``
capacity as a whole number: a share is that many of the device's contexts. Both end up in
CDI device names, environment variables and the checkpoint, so anything but a well-formed
UUID, or a ``contexts`` that is not a positive whole number, is refused here.

A claim without ``status.allocation`` is not allocated (the kubelet should not have asked; the
driver refuses to prepare it). Anything malformed is refused with a ValueError that names the
field, so a bad object is a clear per-claim error rather than a crash or a silent skip.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
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
CONTEXTS = "contexts"
"""The capacity a share consumes (``value_types.pool.CONTEXTS``, spelt here as the API
server stores it)."""
SHARE_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
"""What the API server accepts as a ``shareID`` (RFC 4122, lower case): also a DNS label."""
MAX_CONTEXTS = 1 << 20
"""More contexts than any device has: a bound on what is parsed, not a limit of the API."""
_QUANTITY = re.compile(r"(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
                       r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]{1,3})?")
_SUFFIX = {None: Decimal(1), "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
           "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12),
           "P": Decimal(10**15), "E": Decimal(10**18), "Ki": Decimal(2**10),
           "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40),
           "Pi": Decimal(2**50), "Ei": Decimal(2**60)}


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


def parse_claim(version: str, obj: Mapping[str, Any],
                driver: str | None = None) -> ClaimAllocation:
    """``obj`` (a ResourceClaim as the server answered in ``version``) as the driver knows it.

    ``allocated`` only when ``status.allocation`` exists; ``results`` in the server's order,
    every driver's (:meth:`ClaimAllocation.results_for` picks this driver's). The
    ``contexts`` a share consumed is read for ``driver``'s results (every result's when
    None): another driver's capacity of that name is its own business. Raises ValueError
    naming the field when the object is not a well-formed claim of ``version``.
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
        share_id = _share_id(reader, result, path)
        contexts = _contexts(reader, result, path) if driver in (None, values["driver"]) \
            else None
        results.append(AllocationResult(**values, share_id=share_id,
                                        consumed_contexts=contexts))
    return ClaimAllocation(ref=ref, allocated=True, results=tuple(results), configs=configs,
                           **extra)


def _share_id(reader: _Reader, result: Mapping[str, Any], path: str) -> str | None:
    share = result.get("shareID")
    if share is None:
        return None
    if not isinstance(share, str) or not SHARE_ID.fullmatch(share):
        raise reader.fail(f"{path}.shareID", f"{share!r:.80} is not a UUID in RFC 4122 "
                          "lower-case form (xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)")
    return share


def _contexts(reader: _Reader, result: Mapping[str, Any], path: str) -> int | None:
    consumed = reader.optional(result.get("consumedCapacity"), f"{path}.consumedCapacity")
    if consumed is None or consumed.get(CONTEXTS) is None:
        return None
    value = consumed[CONTEXTS]
    count = whole_quantity(value) if isinstance(value, str) else None
    if count is None:
        raise reader.fail(f"{path}.consumedCapacity.{CONTEXTS}", f"{value!r:.40} is not a "
                          f"positive whole number of contexts (at most {MAX_CONTEXTS})")
    return count


def whole_quantity(text: str) -> int | None:
    """A Kubernetes quantity (``2``, ``2000m``, ``2e0``) that is a whole number from 1 to
    :data:`MAX_CONTEXTS`, or None (k8s.io/apimachinery ``resource.Quantity`` grammar: a
    decimal number with a binary, decimal or exponent suffix)."""
    match = _QUANTITY.fullmatch(text) if len(text) <= 64 else None
    if match is None:
        return None
    suffix = match["suffix"]
    try:
        scale = _SUFFIX[suffix] if suffix is None or suffix[0] not in "eE" \
            else Decimal(10) ** int(suffix[1:])
        value = Decimal(match["number"]) * scale
    except (InvalidOperation, KeyError):
        return None
    if value != value.to_integral_value() or not 1 <= value <= MAX_CONTEXTS:
        return None
    return int(value)


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
