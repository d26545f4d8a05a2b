"""The write path of one object, from request body to a stored-form object, and ``validate``.

Order as in the apiserver's create and update handlers: decode (type errors and, with
``fieldValidation=Strict``, unknown fields fail with 400 BadRequest; ``Warn``, the server default,
drops them and answers with a Warning header), convert to the stored version, default, let the
kind's strategy prepare it, run the validation rules (422 Invalid). ``validate`` runs the same
steps without a server so a test can check any object a driver would send.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from compat_tests.apiserver import convert, errors, rules_claim, rules_slice, schema, strategy
from compat_tests.apiserver.fielderrors import FieldError
from compat_tests.apiserver.models import GROUP, SCHEMA_VERSIONS, ServerModel, load_model
from compat_tests.apiserver.resources import RESOURCES

FIELD_VALIDATIONS = ("Strict", "Warn", "Ignore")
_BY_KIND = {info.kind: name for name, info in RESOURCES.items()}


def _cannot_handle(kind: str, version: str, detail: str) -> errors.ApiError:
    return errors.bad_request(f'{kind} in version "{version}" cannot be handled as a {kind}: '
                              f"{detail}")


def decode_write(resource: str, version: str, body: Any, model: ServerModel,
                 field_validation: str) -> tuple[dict[str, Any], list[str]]:
    """(object in stored v1 form with zero values filled, warnings); ApiError if undecodable."""
    kind = schema.kind_of(resource)
    if not isinstance(body, dict):
        raise errors.bad_request(f"the object provided is unrecognized (must be of type {kind})")
    sent_version, sent_kind = body.get("apiVersion"), body.get("kind")
    expected = convert.api_version(version)
    if sent_kind not in (None, "", kind):
        raise _cannot_handle(str(sent_kind), version,
                             f'no kind "{sent_kind}" is registered for version "{expected}" in '
                             'scheme "pkg/api/legacyscheme/scheme.go:30"')
    if sent_version not in (None, "", expected):
        raise errors.bad_request(f"the API version in the data ({sent_version}) does not match "
                                 f"the expected API version ({expected})")
    decoded = schema.decode(body, resource, version, absent=model.absent_fields(),
                            release=model.schema_release)
    if decoded.errors:
        raise _cannot_handle(kind, version, decoded.errors[0])
    warnings: list[str] = []
    if decoded.unknown and field_validation == "Strict":
        raise _cannot_handle(kind, version, "strict decoding error: " + ", ".join(
            f'unknown field "{path}"' for path in decoded.unknown))
    if decoded.unknown and field_validation == "Warn":
        warnings = [f'unknown field "{path}"' for path in decoded.unknown]
    hub = convert.to_hub(resource, version, decoded.obj)
    hub = schema.encode(hub, resource, convert.HUB, absent=model.absent_fields(),
                        release=model.schema_release)
    hub["apiVersion"], hub["kind"] = convert.api_version(convert.HUB), kind
    strategy.apply_defaults(resource, hub)
    return hub, warnings


def rule_errors(resource: str, new: dict[str, Any], old: dict[str, Any] | None,
                model: ServerModel, status: bool = False) -> list[FieldError]:
    """The validation rules of ``resource`` for a create (``old`` None) or an update."""
    if resource == "resourceslices":
        return rules_slice.validate_slice(new, old, model.taint_effects)
    if resource == "resourceclaims":
        if status and old is not None:
            return rules_claim.validate_claim_status(new, old)
        return rules_claim.validate_claim(new, old, model.taint_effects)
    if resource == "deviceclasses":
        return rules_claim.validate_class(new, old)
    return []


def encode_read(resource: str, version: str, hub: dict[str, Any],
                model: ServerModel) -> dict[str, Any]:
    """A stored object as a client of ``version`` reads it."""
    out = convert.from_hub(resource, version, hub)
    out = schema.encode(out, resource, version, absent=model.absent_fields(),
                        release=model.schema_release)
    out["apiVersion"], out["kind"] = convert.api_version(version), schema.kind_of(resource)
    return out


def validate(obj: dict[str, Any], version: str | None = None, *, model: str = "1.36",
             old: dict[str, Any] | None = None, status: bool = False,
             schema_required: bool = False,
             feature_gates: str | Mapping[str, bool] | None = None) -> list[str]:
    """Every reason a ``model`` server would refuse ``obj`` (empty when it would accept it).

    ``version`` defaults to the one in ``obj["apiVersion"]``; the kind comes from ``obj["kind"]``.
    Unknown fields count as errors (a strict server). With ``schema_required`` also lists fields
    the schema calls required that are missing, which a server would default to zero silently.
    ``old`` (same version as ``obj``) makes it an update check, ``status`` a status update.
    Fields a disabled feature gate drops are not errors: the server drops them silently
    (``feature_gates`` as in ``--feature-gates``), though what is left must still be valid.
    """
    resource = _BY_KIND.get(str(obj.get("kind", "")))
    if resource is None:
        return [f"kind {obj.get('kind')!r} is not one of {sorted(_BY_KIND)}"]
    group, _, api_version = str(obj.get("apiVersion", "")).partition("/")
    version = version or api_version
    if group != GROUP or version not in SCHEMA_VERSIONS:
        return [f"apiVersion {obj.get('apiVersion')!r} is not a served {GROUP} version"]
    if version not in load_model(model).compiled:
        return [f"{GROUP}/{version} is not served by a {model} API server"]
    server = load_model(model, {f"{GROUP}/{version}": True}, feature_gates)
    problems: list[str] = []
    if schema_required:
        problems += [f"{path}: Required value (schema)" for path in schema.missing_required(
            obj, resource, version, server.schema_release)]
    try:
        hub, _ = decode_write(resource, version, obj, server, "Strict")
        old_hub = decode_write(resource, version, old, server, "Ignore")[0] if old else None
    except errors.ApiError as err:
        return [*problems, str(err.status["message"])]
    meta = hub.setdefault("metadata", {})
    if not meta.get("name") and meta.get("generateName"):
        meta["name"] = str(meta["generateName"])[:58] + "bcdfg"  # as the server would
    if old_hub is None:
        strategy.prepare_create(resource, hub, server)
    elif status:
        strategy.prepare_status_update(hub, copy.deepcopy(old_hub), server)
    else:
        strategy.prepare_update(resource, hub, old_hub, server)
    return problems + [str(e) for e in rule_errors(resource, hub, old_hub, server, status)]
