"""Validation rules shared by every resource.k8s.io kind: object metadata, names, node selectors,
device taints and tolerations, qualified names, opaque configuration.

Sources (read, not copied): k/k ``pkg/apis/resource/validation/validation.go`` (validateDriverName
= core ValidateCSIDriverName, validatePoolName, validateQualifiedName, validateDeviceTaint,
validateDeviceToleration, validateRawExtension) and ``pkg/apis/core/validation/validation.go``
(ValidateObjectMeta, ValidateNodeSelector); apimachinery ``pkg/api/validation/objectmeta.go``.
Every rule works on the stored (v1) form, so its paths are the v1 ones whatever version was
written, as on a real server where validation runs on the internal type.
"""

from __future__ import annotations

import json
from typing import Any

from compat_tests.apiserver import fielderrors as fe
from compat_tests.apiserver.fielderrors import FieldError

OPAQUE_PARAMETERS_MAX = 10 * 1024
DRIVER_NAME_MAX = 63
POOL_NAME_MAX = 253
ID_MAX = 32
_NODE_SELECTOR_OPS = ("DoesNotExist", "Exists", "Gt", "In", "Lt", "NotIn")


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def validate_object_meta(meta: dict[str, Any], namespaced: bool) -> list[FieldError]:
    """ValidateObjectMeta with the DNS-subdomain name rule every DRA kind uses."""
    errs: list[FieldError] = []
    name, generate = meta.get("name", ""), meta.get("generateName", "")
    if generate:
        masked = generate[:-1] + "a" if generate.endswith("-") else generate
        errs += [fe.invalid("metadata.generateName", generate, m)
                 for m in fe.dns1123_subdomain(masked)]
    if not name:
        errs.append(fe.required("metadata.name", "name or generateName is required"))
    else:
        errs += [fe.invalid("metadata.name", name, m) for m in fe.dns1123_subdomain(name)]
    if namespaced and not meta.get("namespace"):
        errs.append(fe.required("metadata.namespace"))
    if not namespaced and meta.get("namespace"):
        errs.append(fe.forbidden("metadata.namespace", "not allowed on this type"))
    for key, value in sorted(as_dict(meta.get("labels")).items()):
        errs += [fe.invalid("metadata.labels", key, m) for m in fe.label_key(key)]
        errs += [fe.invalid("metadata.labels", value, m) for m in fe.label_value(value)]
    for key in sorted(as_dict(meta.get("annotations"))):
        errs += [fe.invalid("metadata.annotations", key, m) for m in fe.label_key(key.lower())]
    controllers = 0
    for ref in as_list(meta.get("ownerReferences")):
        ref = as_dict(ref)
        path = "metadata.ownerReferences"
        version = str(ref.get("apiVersion", "")).rpartition("/")[2]
        for key, shown, text in (("apiVersion", version, "version"),
                                 ("kind", ref.get("kind"), "kind"),
                                 ("name", ref.get("name"), "name"), ("uid", ref.get("uid"), "uid")):
            if not shown:
                errs.append(fe.invalid(f"{path}.{key}", ref.get(key, ""),
                                       f"{text} must not be empty"))
        controllers += 1 if ref.get("controller") else 0
    if controllers > 1:
        errs.append(fe.invalid("metadata.ownerReferences", meta.get("ownerReferences"),
                               "Only one reference can have Controller set to true."))
    return errs


def validate_driver_name(name: str, path: str) -> list[FieldError]:
    """core ValidateCSIDriverName: required, at most 63 bytes, a (lower-cased) DNS subdomain."""
    errs: list[FieldError] = []
    if not name:
        errs.append(fe.required(path))
    if len(name) > DRIVER_NAME_MAX:
        errs.append(fe.too_long(path, DRIVER_NAME_MAX))
    errs += [fe.invalid(path, name, m) for m in fe.dns1123_subdomain(name.lower())]
    return errs


def validate_pool_name(name: str, path: str) -> list[FieldError]:
    if not name:
        return [fe.required(path)]
    errs = [fe.too_long(path, POOL_NAME_MAX)] if len(name) > POOL_NAME_MAX else []
    for part in name.split("/"):
        errs += [fe.invalid(path, part, m) for m in fe.dns1123_subdomain(part)]
    return errs


def validate_dns_label(value: str, path: str) -> list[FieldError]:
    return [fe.invalid(path, value, m) for m in fe.dns1123_label(value)]


def validate_dns_subdomain(value: str, path: str) -> list[FieldError]:
    return [fe.invalid(path, value, m) for m in fe.dns1123_subdomain(value)]


def _c_identifier(value: str, path: str) -> list[FieldError]:
    errs = [fe.too_long(path, ID_MAX)] if len(value) > ID_MAX else []
    return errs + [fe.invalid(path, value, m) for m in fe.c_identifier(value)]


def validate_qualified_name(name: str, path: str) -> list[FieldError]:
    """An attribute or capacity name: ``cIdentifier`` or ``domain/cIdentifier``."""
    parts = name.split("/")
    if len(parts) == 1:
        return _c_identifier(name, path)
    if len(parts) > 2:
        return [fe.invalid(path, name, "must not contain more than one slash")]
    errs: list[FieldError] = []
    domain, ident = parts
    if not domain:
        errs.append(fe.invalid(path, "", "the domain must not be empty"))
    else:
        errs += validate_driver_name(domain, path)
    if not ident:
        errs.append(fe.invalid(path, "", "the name must not be empty"))
    else:
        errs += _c_identifier(ident, path)
    return errs


def validate_fully_qualified_name(name: str, path: str) -> list[FieldError]:
    errs = validate_qualified_name(name, path)
    if "/" not in name:
        errs.append(fe.invalid(path, name,
                               "a fully qualified name must be a domain and a name separated "
                               "by a slash"))
    return errs


def validate_node_selector(selector: dict[str, Any], path: str) -> list[FieldError]:
    """core ValidateNodeSelector, for the term shapes a slice or an allocation uses."""
    terms = as_list(selector.get("nodeSelectorTerms"))
    if not terms:
        return [fe.required(f"{path}.nodeSelectorTerms",
                            "must have at least one node selector term")]
    errs: list[FieldError] = []
    for t, term in enumerate(terms):
        term_path = f"{path}.nodeSelectorTerms[{t}]"
        for r, req in enumerate(as_list(as_dict(term).get("matchExpressions"))):
            req, rpath = as_dict(req), f"{term_path}.matchExpressions[{r}]"
            op, values = req.get("operator", ""), as_list(req.get("values"))
            if op in ("In", "NotIn") and not values:
                errs.append(fe.required(f"{rpath}.values",
                                        "must be specified when `operator` is 'In' or 'NotIn'"))
            elif op in ("Exists", "DoesNotExist") and values:
                errs.append(fe.forbidden(f"{rpath}.values", "may not be specified when "
                                         "`operator` is 'Exists' or 'DoesNotExist'"))
            elif op in ("Gt", "Lt") and len(values) != 1:
                errs.append(fe.required(f"{rpath}.values",
                                        "must be specified single value when `operator` is "
                                        "'Lt' or 'Gt'"))
            elif op not in _NODE_SELECTOR_OPS:
                errs.append(fe.not_supported(f"{rpath}.operator", op, _NODE_SELECTOR_OPS))
            key = str(req.get("key", ""))
            errs += [fe.invalid(f"{rpath}.key", key, m) for m in fe.label_key(key)]
        for r, req in enumerate(as_list(as_dict(term).get("matchFields"))):
            req, rpath = as_dict(req), f"{term_path}.matchFields[{r}]"
            if req.get("key") != "metadata.name":
                errs.append(fe.not_supported(f"{rpath}.key", req.get("key", ""),
                                             ("metadata.name",)))
    return errs


def validate_taint(taint: dict[str, Any], path: str, effects: tuple[str, ...],
                   old: dict[str, Any] | None = None) -> list[FieldError]:
    key, value, effect = str(taint.get("key", "")), taint.get("value", ""), taint.get("effect", "")
    errs = [fe.invalid(f"{path}.key", key, m) for m in fe.label_key(key)]
    if value:
        errs += [fe.invalid(f"{path}.value", value, m) for m in fe.label_value(str(value))]
    if old is None or old.get("effect") != effect:
        if not effect:
            errs.append(fe.required(f"{path}.effect"))
        elif effect not in effects:
            errs.append(fe.not_supported(f"{path}.effect", effect, effects))
    return errs


def validate_toleration(tol: dict[str, Any], path: str,
                        effects: tuple[str, ...]) -> list[FieldError]:
    errs: list[FieldError] = []
    key, op, value, effect = (tol.get("key", ""), tol.get("operator", ""), tol.get("value", ""),
                              tol.get("effect", ""))
    if key:
        errs += [fe.invalid(f"{path}.key", key, m) for m in fe.label_key(str(key))]
    if op == "Exists":
        if value:
            errs.append(fe.invalid(f"{path}.value", value, "must be empty for operator `Exists`"))
    elif op == "Equal":
        errs += [fe.invalid(f"{path}.value", value, m) for m in fe.label_value(str(value))]
    elif op == "":
        errs.append(fe.required(f"{path}.operator"))
    else:
        errs.append(fe.not_supported(f"{path}.operator", op, ("Equal", "Exists")))
    if effect and effect not in effects:
        errs.append(fe.not_supported(f"{path}.effect", effect, effects))
    return errs


def validate_opaque(config: dict[str, Any], path: str, stored: bool = False) -> list[FieldError]:
    """A DeviceConfiguration: ``opaque{driver, parameters}`` with parameters a JSON object."""
    opaque = config.get("opaque")
    if not isinstance(opaque, dict):
        return [fe.required(f"{path}.opaque")]
    errs = validate_driver_name(str(opaque.get("driver", "")), f"{path}.opaque.driver")
    params, ppath = opaque.get("parameters"), f"{path}.opaque.parameters"
    raw = json.dumps(params, separators=(",", ":")) if params is not None else ""
    if params is None:
        errs.append(fe.required(ppath))
    elif not stored and len(raw) > OPAQUE_PARAMETERS_MAX:
        errs.append(fe.too_long(ppath, OPAQUE_PARAMETERS_MAX))
    elif not isinstance(params, dict):
        errs.append(fe.invalid(ppath, "<value omitted>", "must be a valid JSON object"))
    return errs


def check_set(items: list[Any], maximum: int, path: str,
              key: Any = None) -> tuple[bool, list[FieldError]]:
    """validateSet's size limit and duplicate check; (too many, errors)."""
    if maximum >= 0 and len(items) > maximum:
        return True, [fe.too_many(path, len(items), maximum)]
    errs: list[FieldError] = []
    if key is not None:
        seen: set[Any] = set()
        for index, item in enumerate(items):
            k = key(item)
            if k in seen:
                errs.append(fe.duplicate(f"{path}[{index}]", k))
            seen.add(k)
    return False, errs
