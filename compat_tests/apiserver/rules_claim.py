"""The server-side rules for ResourceClaims (spec and status) and DeviceClasses.

Read from k/k ``pkg/apis/resource/validation/validation.go`` (ValidateResourceClaim,
ValidateResourceClaimUpdate, ValidateResourceClaimStatusUpdate, validateDeviceRequest,
validateAllocationResult, ValidateDeviceClass) with the limits of k8s.io/api
``resource/v1/types.go`` v0.36.2:

- claim ``metadata.name`` a DNS subdomain, namespaced; spec immutable after create
  (``spec: Invalid value: ...: field is immutable``);
- at most 32 requests with unique DNS-label names, each exactly one of ``exactly`` and
  ``firstAvailable`` (at most 8 subrequests); ``deviceClassName`` required, a DNS subdomain;
  ``allocationMode`` ExactCount (count > 0) or All (no count); at most 32 selectors, each with a
  ``cel`` expression of at most 10 KiB (the expression itself is not compiled here);
  tolerations as for taints; at most 32 constraints and 32 config entries whose ``requests``
  name requests of the claim; opaque parameters a JSON object of at most 10 KiB;
- status: ``reservedFor`` (at most 256, unique uid, resource/name/uid required) only with an
  allocation; an allocation once set is immutable; new results (at most 32) name a request of the
  claim (``req`` or ``req/sub``), a driver, a pool and a DNS-label device; ``status.devices``
  entries (validateDeviceStatus) must be allocated devices (driver, pool, device and shareID), at
  most once (the list map's key), with at most 8 conditions valid as
  ``metav1validation.ValidateConditions`` has them, ``data`` a JSON object of at most 10 KiB
  (validateRawExtension, not stored), ``networkData`` at most 16 CIDR ``ips``, an interface name
  of at most 256 and a hardware address of at most 128 characters;
- DeviceClass: name a DNS subdomain, selectors and config as above, ``extendedResourceName`` a
  valid extended resource name.
"""

from __future__ import annotations

import ipaddress
import json
import re
from typing import Any

from compat_tests.apiserver import fielderrors as fe
from compat_tests.apiserver import rules_common as rc
from compat_tests.apiserver.fielderrors import FieldError
from compat_tests.apiserver.rules_common import as_dict, as_list

MAX_REQUESTS = 32
MAX_SUBREQUESTS = 8
MAX_SELECTORS = 32
MAX_CONSTRAINTS = 32
MAX_CONFIG = 32
MAX_RESERVED_FOR = 256
MAX_RESULTS = 32
MAX_CEL_LENGTH = 10 * 1024
MAX_DEVICE_CONDITIONS = 8
MAX_DEVICE_DATA = 10 * 1024
MAX_NETWORK_IPS = 16
MAX_INTERFACE_NAME = 256
MAX_HARDWARE_ADDRESS = 128
MAX_CONDITION_REASON = 1024
MAX_CONDITION_MESSAGE = 32768
CONDITION_STATUSES = ("False", "True", "Unknown")
_CONDITION_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")
_REQUEST_REF = "must be the name of a request in the claim or the name of a request and a " \
    "subrequest separated by '/'"
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _request_names(spec: dict[str, Any]) -> dict[str, set[str]]:
    names: dict[str, set[str]] = {}
    for request in map(as_dict, as_list(as_dict(spec.get("devices")).get("requests"))):
        names[str(request.get("name", ""))] = {
            str(as_dict(s).get("name", "")) for s in as_list(request.get("firstAvailable"))}
    return names


def _request_ref(name: str, path: str, names: dict[str, set[str]]) -> list[FieldError]:
    parts = name.split("/")
    if len(parts) > 2:
        return [fe.invalid(path, name, _REQUEST_REF)]
    errs = [e for p in parts for e in rc.validate_dns_label(p, path)]
    known = parts[0] in names and (len(parts) == 1 or parts[1] in names[parts[0]])
    return errs if known else [*errs, fe.invalid(path, name, _REQUEST_REF)]


def _selectors(selectors: list[Any], path: str) -> list[FieldError]:
    if len(selectors) > MAX_SELECTORS:
        return [fe.too_many(path, len(selectors), MAX_SELECTORS)]
    errs: list[FieldError] = []
    for index, selector in enumerate(map(as_dict, selectors)):
        cel = selector.get("cel")
        if not isinstance(cel, dict):
            errs.append(fe.required(f"{path}[{index}].cel"))
        elif len(str(cel.get("expression", ""))) > MAX_CEL_LENGTH:
            errs.append(fe.too_long(f"{path}[{index}].cel.expression", MAX_CEL_LENGTH))
    return errs


def _exact(request: dict[str, Any], path: str, effects: tuple[str, ...]) -> list[FieldError]:
    errs: list[FieldError] = []
    class_name = str(request.get("deviceClassName", ""))
    if not class_name:
        errs.append(fe.required(f"{path}.deviceClassName"))
    else:
        errs += rc.validate_dns_subdomain(class_name, f"{path}.deviceClassName")
    errs += _selectors(as_list(request.get("selectors")), f"{path}.selectors")
    mode, count = request.get("allocationMode", ""), request.get("count", 0)
    if mode == "All":
        if count:
            errs.append(fe.invalid(f"{path}.count", count,
                                   "must not be specified when allocationMode is 'All'"))
    elif mode == "ExactCount":
        if count <= 0:
            errs.append(fe.invalid(f"{path}.count", count, "must be greater than zero"))
    else:
        errs.append(fe.not_supported(f"{path}.allocationMode", mode, ("All", "ExactCount")))
    for index, tol in enumerate(map(as_dict, as_list(request.get("tolerations")))):
        errs += rc.validate_toleration(tol, f"{path}.tolerations[{index}]", effects)
    return errs


def validate_claim_spec(spec: dict[str, Any], effects: tuple[str, ...],
                        path: str = "spec") -> list[FieldError]:
    devices = as_dict(spec.get("devices"))
    requests = [as_dict(r) for r in as_list(devices.get("requests"))]
    names = _request_names(spec)
    rpath = f"{path}.devices.requests"
    too_many, errs = rc.check_set(requests, MAX_REQUESTS, rpath, lambda r: r.get("name", ""))
    for index, request in enumerate([] if too_many else requests):
        here = f"{rpath}[{index}]"
        errs += rc.validate_dns_label(str(request.get("name", "")), f"{here}.name")
        subs = [as_dict(s) for s in as_list(request.get("firstAvailable"))]
        exact = request.get("exactly")
        if not subs and exact is None:
            errs.append(fe.required(here, "exactly one of `exactly` or `firstAvailable` is "
                                    "required"))
        elif subs and exact is not None:
            errs.append(fe.invalid(here, None, "exactly one of `exactly` or `firstAvailable` is "
                                   "required, but multiple fields are set"))
        elif exact is not None:
            errs += _exact(as_dict(exact), f"{here}.exactly", effects)
        else:
            sub_too_many, sub_errs = rc.check_set(subs, MAX_SUBREQUESTS, f"{here}.firstAvailable",
                                                  lambda s: s.get("name", ""))
            for sub_index, sub in enumerate([] if sub_too_many else subs):
                sub_path = f"{here}.firstAvailable[{sub_index}]"
                errs += rc.validate_dns_label(str(sub.get("name", "")), f"{sub_path}.name")
                errs += _exact(sub, sub_path, effects)
            errs += sub_errs
    constraints = [as_dict(c) for c in as_list(devices.get("constraints"))]
    if len(constraints) > MAX_CONSTRAINTS:
        errs.append(fe.too_many(f"{path}.devices.constraints", len(constraints), MAX_CONSTRAINTS))
        constraints = []
    for index, constraint in enumerate(constraints):
        here = f"{path}.devices.constraints[{index}]"
        for ref in as_list(constraint.get("requests")):
            errs += _request_ref(str(ref), f"{here}.requests", names)
        if "matchAttribute" in constraint:
            errs += rc.validate_fully_qualified_name(str(constraint["matchAttribute"]),
                                                     f"{here}.matchAttribute")
        elif "distinctAttribute" in constraint:
            errs += rc.validate_fully_qualified_name(str(constraint["distinctAttribute"]),
                                                     f"{here}.distinctAttribute")
        else:
            errs.append(fe.required(f"{here}.matchAttribute"))
    configs = [as_dict(c) for c in as_list(devices.get("config"))]
    if len(configs) > MAX_CONFIG:
        return [*errs, fe.too_many(f"{path}.devices.config", len(configs), MAX_CONFIG)]
    for index, config in enumerate(configs):
        here = f"{path}.devices.config[{index}]"
        for ref in as_list(config.get("requests")):
            errs += _request_ref(str(ref), f"{here}.requests", names)
        errs += rc.validate_opaque(config, here)
    return errs


def validate_claim(new: dict[str, Any], old: dict[str, Any] | None,
                   effects: tuple[str, ...]) -> list[FieldError]:
    errs = rc.validate_object_meta(as_dict(new.get("metadata")), namespaced=True)
    if old is None:
        return errs + validate_claim_spec(as_dict(new.get("spec")), effects)
    if new.get("spec") != old.get("spec"):
        errs.append(fe.invalid("spec", new.get("spec"), "field is immutable"))
    return errs


def _device_key(entry: dict[str, Any]) -> tuple[str, str, str, str]:
    return (str(entry.get("driver", "")), str(entry.get("pool", "")),
            str(entry.get("device", "")), str(entry.get("shareID", "")))


def validate_claim_status(new: dict[str, Any], old: dict[str, Any]) -> list[FieldError]:
    """ValidateResourceClaimStatusUpdate, ``new`` carrying the stored spec."""
    errs: list[FieldError] = []
    status, old_status = as_dict(new.get("status")), as_dict(old.get("status"))
    reserved = [as_dict(r) for r in as_list(status.get("reservedFor"))]
    too_many, set_errs = rc.check_set(reserved, MAX_RESERVED_FOR, "status.reservedFor",
                                      lambda r: r.get("uid", ""))
    for index, ref in enumerate([] if too_many else reserved):
        for key in ("resource", "name", "uid"):
            if not ref.get(key):
                errs.append(fe.required(f"status.reservedFor[{index}].{key}"))
    errs += set_errs
    allocation = status.get("allocation")
    results = [as_dict(r) for r in as_list(as_dict(as_dict(allocation).get("devices"))
                                           .get("results"))]
    allocated = {_device_key({**r, "shareID": r.get("shareID", "")}) for r in results}
    seen: set[tuple[str, str, str, str]] = set()
    for index, device in enumerate(map(as_dict, as_list(status.get("devices")))):
        here = f"status.devices[{index}]"
        errs += rc.validate_driver_name(str(device.get("driver", "")), f"{here}.driver")
        errs += rc.validate_pool_name(str(device.get("pool", "")), f"{here}.pool")
        errs += rc.validate_dns_label(str(device.get("device", "")), f"{here}.device")
        share = device.get("shareID")
        if share is not None and not _UUID.fullmatch(str(share)):
            errs.append(fe.invalid(f"{here}.shareID", share, "uid must be in RFC 4122 "
                                   "normalized form, `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` with "
                                   "lowercase hexadecimal characters"))
        key = _device_key(device)
        if key not in allocated:
            errs.append(fe.invalid(here, "/".join(key[:3]) + (f"/{key[3]}" if key[3] else ""),
                                   "must be an allocated device in the claim"))
        if key in seen:
            errs.append(fe.duplicate(here, "/".join(key[:3])))
        seen.add(key)
        errs += _device_conditions(as_list(device.get("conditions")), f"{here}.conditions")
        if "data" in device and device["data"] is not None:
            errs += _raw_extension(device["data"], f"{here}.data", MAX_DEVICE_DATA)
        if isinstance(device.get("networkData"), dict):
            errs += _network_data(device["networkData"], f"{here}.networkData")
    if reserved and allocation is None:
        errs.append(fe.forbidden("status.reservedFor",
                                 "may not be specified when `allocated` is not set"))
    old_allocation = old_status.get("allocation")
    if old_allocation is not None and allocation is not None:
        if allocation != old_allocation:
            errs.append(fe.invalid("status.allocation", allocation, "field is immutable"))
    elif allocation is not None:
        errs += _allocation(as_dict(allocation), _request_names(as_dict(new.get("spec"))))
    return errs


def _device_conditions(conditions: list[Any], path: str) -> list[FieldError]:
    """validateDeviceStatus's limit, then apimachinery ``metav1validation.ValidateConditions``
    (``pkg/apis/meta/v1/validation/validation.go``): unique qualified-name types, a known
    status, a set ``lastTransitionTime``, a CamelCase ``reason``, a bounded message."""
    errs: list[FieldError] = []
    if len(conditions) > MAX_DEVICE_CONDITIONS:
        errs.append(fe.too_many(path, len(conditions), MAX_DEVICE_CONDITIONS))
    types: set[str] = set()
    for index, condition in enumerate(map(as_dict, conditions)):
        here = f"{path}[{index}]"
        kind = str(condition.get("type", ""))
        if kind in types:
            errs.append(fe.duplicate(f"{here}.type", kind))
        types.add(kind)
        errs += [fe.invalid(f"{here}.type", kind, m) for m in fe.label_key(kind)]
        value = condition.get("status", "")
        if value not in CONDITION_STATUSES:
            errs.append(fe.not_supported(f"{here}.status", value, CONDITION_STATUSES))
        if condition.get("observedGeneration", 0) < 0:
            errs.append(fe.invalid(f"{here}.observedGeneration",
                                   condition.get("observedGeneration"),
                                   "must be greater than or equal to zero"))
        since = condition.get("lastTransitionTime")
        if not since:
            errs.append(fe.required(f"{here}.lastTransitionTime", "must be set"))
        elif not _RFC3339.match(str(since)):
            errs.append(fe.invalid(f"{here}.lastTransitionTime", since, "must be RFC 3339"))
        reason = str(condition.get("reason", ""))
        if not reason:
            errs.append(fe.required(f"{here}.reason", "must be set"))
        else:
            if len(reason) > MAX_CONDITION_REASON:
                errs.append(fe.too_long(f"{here}.reason", MAX_CONDITION_REASON))
            if not _CONDITION_REASON.match(reason):
                errs.append(fe.invalid(f"{here}.reason", reason,
                                       "a condition reason must start with alphabetic "
                                       "character, optionally followed by a string of "
                                       "alphanumeric characters or '_,:', and must end with "
                                       "an alphanumeric character or '_' (e.g. 'my_name',  or "
                                       "'MY_NAME',  or 'MyName',  or 'ReasonA,ReasonB',  or "
                                       "'ReasonA:ReasonB', regex used for validation is "
                                       "'[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?')"))
        if len(str(condition.get("message", ""))) > MAX_CONDITION_MESSAGE:
            errs.append(fe.too_long(f"{here}.message", MAX_CONDITION_MESSAGE))
    return errs


def _raw_extension(value: Any, path: str, maximum: int) -> list[FieldError]:
    """validateRawExtension(raw, path, stored=false, maximum): a JSON object, raw length at
    most ``maximum`` (the length as sent; compact JSON here)."""
    raw = json.dumps(value, separators=(",", ":"))
    if len(raw) > maximum:
        return [fe.too_long(path, maximum)]
    if not isinstance(value, dict):
        return [fe.invalid(path, "<value omitted>", "must be a valid JSON object")]
    return []


def _network_data(data: dict[str, Any], path: str) -> list[FieldError]:
    """validateNetworkDeviceData: sizes and CIDR addresses."""
    errs: list[FieldError] = []
    if len(str(data.get("interfaceName", ""))) > MAX_INTERFACE_NAME:
        errs.append(fe.too_long(f"{path}.interfaceName", MAX_INTERFACE_NAME))
    if len(str(data.get("hardwareAddress", ""))) > MAX_HARDWARE_ADDRESS:
        errs.append(fe.too_long(f"{path}.hardwareAddress", MAX_HARDWARE_ADDRESS))
    ips = as_list(data.get("ips"))
    if len(ips) > MAX_NETWORK_IPS:
        return [*errs, fe.too_many(f"{path}.ips", len(ips), MAX_NETWORK_IPS)]
    seen: set[str] = set()
    for index, ip in enumerate(ips):
        here = f"{path}.ips[{index}]"
        try:
            ipaddress.ip_interface(str(ip))
            if "/" not in str(ip):
                raise ValueError(ip)
        except ValueError:
            errs.append(fe.invalid(here, ip, "must be a valid address in CIDR form, (e.g. "
                                   "10.9.8.7/24 or 2001:db8::1/64)"))
        if ip in seen:
            errs.append(fe.duplicate(here, ip))
        seen.add(str(ip))
    return errs


def _allocation(allocation: dict[str, Any], names: dict[str, set[str]]) -> list[FieldError]:
    devices = as_dict(allocation.get("devices"))
    results = [as_dict(r) for r in as_list(devices.get("results"))]
    path = "status.allocation.devices.results"
    if len(results) > MAX_RESULTS:
        return [fe.too_many(path, len(results), MAX_RESULTS)]
    errs: list[FieldError] = []
    for index, result in enumerate(results):
        here = f"{path}[{index}]"
        errs += _request_ref(str(result.get("request", "")), f"{here}.request", names)
        errs += rc.validate_driver_name(str(result.get("driver", "")), f"{here}.driver")
        errs += rc.validate_pool_name(str(result.get("pool", "")), f"{here}.pool")
        errs += rc.validate_dns_label(str(result.get("device", "")), f"{here}.device")
        share = result.get("shareID")
        if share is not None and not _UUID.fullmatch(str(share)):
            errs.append(fe.invalid(f"{here}.shareID", share, "uid must be in RFC 4122 "
                                   "normalized form, `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` with "
                                   "lowercase hexadecimal characters"))
    for index, config in enumerate(map(as_dict, as_list(devices.get("config")))):
        here = f"status.allocation.devices.config[{index}]"
        source = config.get("source", "")
        if source not in ("FromClass", "FromClaim"):
            errs.append(fe.required(f"{here}.source") if not source else
                        fe.not_supported(f"{here}.source", source, ("FromClaim", "FromClass")))
        for ref in as_list(config.get("requests")):
            errs += _request_ref(str(ref), f"{here}.requests", names)
        errs += rc.validate_opaque(config, here, stored=True)
    if "nodeSelector" in allocation:
        errs += rc.validate_node_selector(as_dict(allocation["nodeSelector"]),
                                          "status.allocation.nodeSelector")
    return errs


def is_extended_resource_name(name: str) -> bool:
    """core v1helper.IsExtendedResourceName: ``domain/name``, not native, quota-safe."""
    if "/" not in name or "kubernetes.io/" in name or name.startswith("requests."):
        return False
    return not fe.label_key("requests." + name)


def validate_class(new: dict[str, Any], old: dict[str, Any] | None) -> list[FieldError]:
    errs = rc.validate_object_meta(as_dict(new.get("metadata")), namespaced=False)
    spec, old_spec = as_dict(new.get("spec")), as_dict((old or {}).get("spec"))
    if old is None or spec.get("selectors") != old_spec.get("selectors"):
        errs += _selectors(as_list(spec.get("selectors")), "spec.selectors")
    configs = as_list(spec.get("config"))
    if len(configs) > MAX_CONFIG:
        errs.append(fe.too_many("spec.config", len(configs), MAX_CONFIG))
    else:
        stored = old is not None and spec.get("config") == old_spec.get("config")
        for index, config in enumerate(map(as_dict, configs)):
            errs += rc.validate_opaque(config, f"spec.config[{index}]", stored)
    name = spec.get("extendedResourceName")
    if name is not None and not is_extended_resource_name(str(name)):
        errs.append(fe.invalid("spec.extendedResourceName", name,
                               "must be a valid extended resource name"))
    return errs
