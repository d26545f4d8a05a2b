"""The server-side rules a ResourceSlice must pass that its OpenAPI schema cannot express.

Read from k/k ``pkg/apis/resource/validation/validation.go`` (ValidateResourceSlice,
validateResourceSliceSpec, validateResourcePool, validateDevice, validateDeviceAttribute,
validateCounterSet, validateDeviceBindingParameters) with the limits of k8s.io/api
``resource/v1/types.go`` at v0.36.2:

- ``metadata.name`` a DNS subdomain (or ``generateName``);
- ``spec.driver`` a DNS subdomain of at most 63 bytes; ``spec.pool.name`` at most 253 bytes of
  ``/``-separated DNS subdomains; ``pool.resourceSliceCount`` > 0, ``pool.generation`` >= 0;
- ``driver``, ``pool.name`` and ``nodeName`` immutable on update;
- exactly one of ``nodeName`` (non-empty, a DNS subdomain), ``nodeSelector`` (exactly one term),
  ``allNodes`` (true), ``perDeviceNodeSelection`` (true); ``sharedCounters`` xor ``devices``;
- at most 128 devices, 64 when any device has taints, consumes counters or list attributes;
  device names unique DNS labels;
- per device: at most 32 attributes and capacities together and 48 attribute values; attribute
  and capacity names qualified (``cIdentifier`` of at most 32 bytes, optionally behind a
  ``domain/`` that is a driver name); each attribute exactly one of int, bool, string, version
  (and, 1.36+, ints, bools, strings, versions), strings at most 64 bytes, versions semver 2.0.0;
  ``capacity.requestPolicy`` only with ``allowMultipleAllocations``, and then valid
  (:mod:`compat_tests.apiserver.rules_capacity`);
- taints: at most 16, key a label key, value a label value, effect NoSchedule or NoExecute (and
  None from 1.36); only re-checked when they changed;
- consumesCounters: at most 2 sets, counter names DNS labels; sharedCounters at most 8 sets of at
  most 32 counters; device-level nodeName/nodeSelector/allNodes only with perDeviceNodeSelection;
- bindingConditions and bindingFailureConditions: at most 4 label keys each, both or neither.
"""

from __future__ import annotations

from typing import Any

from compat_tests.apiserver import fielderrors as fe
from compat_tests.apiserver import rules_common as rc
from compat_tests.apiserver.fielderrors import FieldError
from compat_tests.apiserver.rules_capacity import validate_request_policy
from compat_tests.apiserver.rules_common import as_dict, as_list

MAX_DEVICES = 128
MAX_DEVICES_ADVANCED = 64
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_ATTRIBUTE_VALUES = 48
MAX_ATTRIBUTE_VALUE_LENGTH = 64
MAX_TAINTS = 16
MAX_COUNTER_SETS = 8
MAX_COUNTERS = 32
MAX_CONSUMES_COUNTERS = 2
MAX_BINDING_CONDITIONS = 4
_SCALARS = ("int", "bool", "string", "version")
_LISTS = ("ints", "bools", "strings", "versions")


def _advanced(devices: list[dict[str, Any]]) -> bool:
    for device in devices:
        if device.get("taints") or device.get("consumesCounters"):
            return True
        if any(any(k in as_dict(a) for k in _LISTS)
               for a in as_dict(device.get("attributes")).values()):
            return True
    return False


def validate_slice(new: dict[str, Any], old: dict[str, Any] | None,
                   effects: tuple[str, ...]) -> list[FieldError]:
    """Every rule violation of slice ``new`` (v1 form); ``old`` is the stored one on update."""
    errs = rc.validate_object_meta(as_dict(new.get("metadata")), namespaced=False)
    spec, old_spec = as_dict(new.get("spec")), as_dict((old or {}).get("spec"))
    errs += rc.validate_driver_name(str(spec.get("driver", "")), "spec.driver")
    pool = as_dict(spec.get("pool"))
    errs += rc.validate_pool_name(str(pool.get("name", "")), "spec.pool.name")
    count, generation = pool.get("resourceSliceCount", 0), pool.get("generation", 0)
    if count <= 0:
        errs.append(fe.invalid("spec.pool.resourceSliceCount", count, "must be greater than zero"))
    if generation < 0:
        errs.append(fe.invalid("spec.pool.generation", generation,
                               "must be greater than or equal to zero"))
    if old is not None:
        for path, now, before in (
                ("spec.pool.name", pool.get("name", ""), as_dict(old_spec.get("pool")).get("name")),
                ("spec.driver", spec.get("driver", ""), old_spec.get("driver")),
                ("spec.nodeName", spec.get("nodeName"), old_spec.get("nodeName"))):
            if now != before:
                errs.append(fe.invalid(path, now if now is not None else "null",
                                       "field is immutable"))
    errs += _node_selection(spec)
    if "sharedCounters" in spec and "devices" in spec:
        errs.append(fe.invalid("spec", "", "only one of `sharedCounters` or `devices` is allowed"))
    devices = [as_dict(d) for d in as_list(spec.get("devices"))]
    limit = MAX_DEVICES_ADVANCED if _advanced(devices) else MAX_DEVICES
    too_many, set_errs = rc.check_set(devices, limit, "spec.devices", lambda d: d.get("name", ""))
    if not too_many:
        old_devices = {d.get("name"): d for d in map(as_dict, as_list(old_spec.get("devices")))}
        for index, device in enumerate(devices):
            errs += _device(device, old_devices.get(device.get("name")), f"spec.devices[{index}]",
                            spec.get("perDeviceNodeSelection") is True, effects)
    errs += set_errs
    counter_sets = [as_dict(c) for c in as_list(spec.get("sharedCounters"))]
    too_many, set_errs = rc.check_set(counter_sets, MAX_COUNTER_SETS, "spec.sharedCounters",
                                      lambda c: c.get("name", ""))
    if not too_many:
        for index, counter_set in enumerate(counter_sets):
            errs += _counters(counter_set, "name", f"spec.sharedCounters[{index}]")
    return errs + set_errs


def _node_selection(spec: dict[str, Any]) -> list[FieldError]:
    errs: list[FieldError] = []
    chosen: list[str] = []
    if "nodeName" in spec:
        if spec["nodeName"]:
            chosen.append("`nodeName`")
            errs += rc.validate_dns_subdomain(spec["nodeName"], "spec.nodeName")
        else:
            errs.append(fe.invalid("spec.nodeName", spec["nodeName"],
                                   "must be either unset or set to a non-empty string"))
    if "nodeSelector" in spec:
        chosen.append("`nodeSelector`")
        selector = as_dict(spec["nodeSelector"])
        errs += rc.validate_node_selector(selector, "spec.nodeSelector")
        terms = as_list(selector.get("nodeSelectorTerms"))
        if len(terms) != 1:
            errs.append(fe.invalid("spec.nodeSelector.nodeSelectorTerms", terms,
                                   "must have exactly one node selector term"))
    for key in ("allNodes", "perDeviceNodeSelection"):
        if key in spec:
            if spec[key] is True:
                chosen.append(f"`{key}`")
            else:
                errs.append(fe.invalid(f"spec.{key}", spec[key],
                                       "must be either unset or set to true"))
    one_of = "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection`"
    if not chosen:
        errs.append(fe.required("spec", f"{one_of} is required"))
    elif len(chosen) > 1:
        errs.append(fe.invalid("spec", "{" + ", ".join(chosen) + "}",
                               f"{one_of} is required, but multiple fields are set"))
    return errs


def _device(device: dict[str, Any], old: dict[str, Any] | None, path: str,
            per_device: bool, effects: tuple[str, ...]) -> list[FieldError]:
    errs = rc.validate_dns_label(str(device.get("name", "")), f"{path}.name")
    attributes, capacity = as_dict(device.get("attributes")), as_dict(device.get("capacity"))
    total = len(attributes) + len(capacity)
    if total > MAX_ATTRIBUTES_AND_CAPACITIES:
        errs.append(fe.invalid(path, total, "the total number of attributes and capacities "
                               f"must not exceed {MAX_ATTRIBUTES_AND_CAPACITIES}"))
    values = sum(max(1, sum(len(as_list(as_dict(a).get(k))) for k in _LISTS))
                 for a in attributes.values())
    if values > MAX_ATTRIBUTE_VALUES:
        errs.append(fe.invalid(path, values, "the total number of attribute values must not "
                               f"exceed {MAX_ATTRIBUTE_VALUES}"))
    for key in sorted(attributes):
        errs += rc.validate_qualified_name(key, f"{path}.attributes")
        errs += _attribute(as_dict(attributes[key]), f"{path}.attributes[{key}]")
    if old is None or old.get("capacity") != device.get("capacity"):
        multi = device.get("allowMultipleAllocations") is True
        for key in sorted(capacity):
            errs += rc.validate_qualified_name(key, f"{path}.capacity")
            if not multi and "requestPolicy" in as_dict(capacity[key]):
                errs.append(fe.forbidden(f"{path}.capacity[{key}].requestPolicy",
                                         "allowMultipleAllocations must be true"))
            elif multi:
                errs += validate_request_policy(as_dict(capacity[key]), f"{path}.capacity[{key}]")
    taints = [as_dict(t) for t in as_list(device.get("taints"))]
    if old is None or old.get("taints") != device.get("taints"):
        if len(taints) > MAX_TAINTS:
            errs.append(fe.too_many(f"{path}.taints", len(taints), MAX_TAINTS))
        else:
            for index, taint in enumerate(taints):
                errs += rc.validate_taint(taint, f"{path}.taints[{index}]", effects)
    consumes = [as_dict(c) for c in as_list(device.get("consumesCounters"))]
    too_many, set_errs = rc.check_set(consumes, MAX_CONSUMES_COUNTERS, f"{path}.consumesCounters",
                                      lambda c: c.get("counterSet", ""))
    if not too_many:
        for index, consumption in enumerate(consumes):
            errs += _counters(consumption, "counterSet", f"{path}.consumesCounters[{index}]")
    errs += set_errs + _device_nodes(device, path, per_device)
    return errs + _binding(device, path)


def _attribute(attribute: dict[str, Any], path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    present = [k for k in (*_SCALARS, *_LISTS) if k in attribute]
    text = attribute.get("string")
    if isinstance(text, str) and len(text) > MAX_ATTRIBUTE_VALUE_LENGTH:
        errs.append(fe.too_long(f"{path}.string", MAX_ATTRIBUTE_VALUE_LENGTH))
    version = attribute.get("version")
    if isinstance(version, str):
        errs += _version(version, f"{path}.version")
    for key in _LISTS:
        if key in attribute and not as_list(attribute[key]):
            errs.append(fe.invalid(f"{path}.{key}", [], "must not be empty if specified"))
    for index, item in enumerate(as_list(attribute.get("strings"))):
        if isinstance(item, str) and len(item) > MAX_ATTRIBUTE_VALUE_LENGTH:
            errs.append(fe.too_long(f"{path}.strings[{index}]", MAX_ATTRIBUTE_VALUE_LENGTH))
    for index, item in enumerate(as_list(attribute.get("versions"))):
        errs += _version(str(item), f"{path}.versions[{index}]")
    if not present:
        errs.append(fe.invalid(path, "", "exactly one value must be specified"))
    elif len(present) > 1:
        errs.append(fe.invalid(path, attribute, "exactly one value must be specified"))
    return errs


def _version(value: str, path: str) -> list[FieldError]:
    errs = [] if fe.is_semver(value) else [
        fe.invalid(path, value, "must be a string compatible with semver.org spec 2.0.0")]
    if len(value) > MAX_ATTRIBUTE_VALUE_LENGTH:
        errs.append(fe.too_long(path, MAX_ATTRIBUTE_VALUE_LENGTH))
    return errs


def _counters(owner: dict[str, Any], name_key: str, path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    name = owner.get(name_key, "")
    if not name:
        errs.append(fe.required(f"{path}.{name_key}"))
    else:
        errs += rc.validate_dns_label(name, f"{path}.{name_key}")
    counters = as_dict(owner.get("counters"))
    if not counters:
        errs.append(fe.required(f"{path}.counters"))
    elif len(counters) > MAX_COUNTERS:
        errs.append(fe.too_many(f"{path}.counters", len(counters), MAX_COUNTERS))
    else:
        for key in sorted(counters):
            errs += rc.validate_dns_label(key, f"{path}.counters")
    return errs


def _device_nodes(device: dict[str, Any], path: str, per_device: bool) -> list[FieldError]:
    keys = [k for k in ("nodeName", "nodeSelector", "allNodes") if k in device]
    if not per_device:
        if keys:
            return [fe.invalid(path, None, "`nodeName`, `nodeSelector` and `allNodes` can only "
                               "be set if `perDeviceNodeSelection` is set to true in the "
                               "ResourceSlice spec")]
        return []
    errs: list[FieldError] = []
    chosen: list[str] = []
    if "nodeName" in device:
        if device["nodeName"]:
            chosen.append("`nodeName`")
            errs += rc.validate_dns_subdomain(device["nodeName"], f"{path}.nodeName")
        else:
            errs.append(fe.invalid(f"{path}.nodeName", "", "must not be empty"))
    if "nodeSelector" in device:
        chosen.append("`nodeSelector`")
        errs += rc.validate_node_selector(as_dict(device["nodeSelector"]), f"{path}.nodeSelector")
    if "allNodes" in device:
        if device["allNodes"] is True:
            chosen.append("`allNodes`")
        else:
            errs.append(fe.invalid(f"{path}.allNodes", device["allNodes"],
                                   "must be either unset or set to true"))
    detail = ("exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required when "
              "`perDeviceNodeSelection` is set to true in the ResourceSlice spec")
    if not chosen:
        errs.append(fe.required(path, detail))
    elif len(chosen) > 1:
        errs.append(fe.invalid(path, "{" + ", ".join(chosen) + "}", detail))
    return errs


def _binding(owner: dict[str, Any], path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    conditions = [str(c) for c in as_list(owner.get("bindingConditions"))]
    failures = [str(c) for c in as_list(owner.get("bindingFailureConditions"))]
    for key, items in (("bindingConditions", conditions), ("bindingFailureConditions", failures)):
        if len(items) > MAX_BINDING_CONDITIONS:
            errs.append(fe.too_many(f"{path}.{key}", len(items), MAX_BINDING_CONDITIONS))
            continue
        seen: set[str] = set()
        for index, item in enumerate(items):
            errs += [fe.invalid(f"{path}.{key}", item, m) for m in fe.label_key(item)]
            if item in seen:
                errs.append(fe.duplicate(f"{path}.{key}[{index}]", item))
            seen.add(item)
            if key == "bindingFailureConditions" and item in conditions:
                errs.append(fe.invalid(f"{path}.{key}[{index}]", item, "bindingFailureConditions "
                                       "must not overlap with bindingConditions"))
    if failures and not conditions:
        errs.append(fe.invalid(f"{path}.bindingConditions", conditions,
                               "bindingConditions are required to use bindingFailureConditions"))
    if conditions and not failures:
        errs.append(fe.invalid(f"{path}.bindingFailureConditions", failures,
                               "bindingFailureConditions are required to use bindingConditions"))
    return errs
