"""Decode a written object against the OpenAPI v3 schema of its version, as the server does.

A kube-apiserver decodes JSON into Go structs: a wrong JSON type, a bad quantity or date, and
(with ``fieldValidation=Strict``) an unknown field make the request fail with 400 BadRequest
before any validation rule runs; with ``Warn`` (the server default since 1.27) or ``Ignore``
unknown fields are dropped. Encoding writes zero values of non-``omitempty`` fields back, which
the published schema marks with ``default``. This module does all of that from the schemas a 1.36
server serves (copied under ``openapi/1.36/``) or, for a 1.37+ model, the 1.37 ones
(``openapi/1.37/``, derived as its README says), so no Go type is needed. It deliberately does not
enforce ``required``: the Go decoder does not either; missing fields become zero values and the
validation rules (rules.py) report them the way the server does.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from importlib import resources
from typing import Any

from compat_tests.apiserver import quantity

DEFAULT_RELEASE = "1.36"
RELEASES = ("1.36", "1.37")
"""The schema sets shipped, each under ``openapi/<release>/``."""
_KINDS = {"resourceslices": "ResourceSlice", "resourceclaims": "ResourceClaim",
          "deviceclasses": "DeviceClass"}
_QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
_TIME = "io.k8s.apimachinery.pkg.apis.meta.v1.Time"


@cache
def load(version: str, release: str = DEFAULT_RELEASE) -> dict[str, Any]:
    """The ``components.schemas`` of resource.k8s.io ``version`` (v1, v1beta1, v1beta2) as a
    ``release`` server serves them (one of ``RELEASES``)."""
    if release not in RELEASES:
        raise ValueError(f"no resource.k8s.io schemas of {release}; shipped: {RELEASES}")
    name = f"resource.k8s.io_{version}.json"
    text = resources.files("compat_tests.apiserver").joinpath(
        f"openapi/{release}", name).read_text()
    return json.loads(text)["components"]["schemas"]


def definition_name(version: str, kind: str) -> str:
    return f"io.k8s.api.resource.{version}.{kind}"


def kind_of(resource: str) -> str:
    return _KINDS[resource]


@dataclass
class Decoded:
    """What decoding found: the normalized object, unknown fields and fatal decode errors."""

    obj: dict[str, Any]
    unknown: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _ref_name(schema: dict[str, Any]) -> str | None:
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    all_of = schema.get("allOf")
    if isinstance(all_of, list) and len(all_of) == 1 and "$ref" in all_of[0]:
        return str(all_of[0]["$ref"]).rsplit("/", 1)[-1]
    return None


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return f"number {json.dumps(value)}"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _go_type(schema: dict[str, Any], name: str | None) -> str:
    if name:
        return name.rsplit(".", 1)[-1]
    kind = schema.get("type")
    if kind == "integer":
        return str(schema.get("format", "int64"))
    if kind == "boolean":
        return "bool"
    if kind == "array":
        return "[]" + _go_type(schema.get("items", {}), _ref_name(schema.get("items", {})))
    if kind == "object":
        return "map[string]" + _go_type(schema.get("additionalProperties", {}), _ref_name(
            schema.get("additionalProperties", {})))
    return str(kind or "interface {}")


class _Walker:
    """One decoding pass over an object, with the schema set of one version."""

    def __init__(self, version: str, absent: Iterable[tuple[str, str]], drop_unknown: bool,
                 defaults: bool, release: str = DEFAULT_RELEASE) -> None:
        self.schemas = load(version, release)
        self.absent = set(absent)
        self.drop_unknown = drop_unknown
        self.defaults = defaults
        self.unknown: list[str] = []
        self.errors: list[str] = []
        self.struct = ""

    def walk(self, value: Any, schema: dict[str, Any], path: str) -> Any:
        name = _ref_name(schema)
        if name is not None:
            if name == _QUANTITY:
                return self._quantity(value, path)
            resolved = self.schemas[name]
            self.struct = name.rsplit(".", 1)[-1]
            return self._typed(value, resolved, path, name)
        return self._typed(value, schema, path, None)

    def _quantity(self, value: Any, path: str) -> Any:
        try:
            return quantity.canonical(value)
        except quantity.QuantityError as err:
            self.errors.append(f"{path}: {err}" if path else str(err))
            return value

    def _mismatch(self, value: Any, schema: dict[str, Any], name: str | None, path: str) -> Any:
        self.errors.append(
            f"json: cannot unmarshal {_json_type(value)} into Go struct field "
            f"{self.struct}.{path} of type {_go_type(schema, name)}")
        return value

    def _typed(self, value: Any, schema: dict[str, Any], path: str, name: str | None) -> Any:
        kind = schema.get("type")
        if kind == "object" or "properties" in schema:
            if not isinstance(value, dict):
                return self._mismatch(value, schema, name, path)
            if "properties" in schema:
                return self._struct(value, schema, path, name)
            extra = schema.get("additionalProperties")
            if extra is None:
                return value  # free-form: RawExtension, FieldsV1
            return {k: self.walk(v, extra, f"{path}[{k}]") for k, v in value.items()
                    if v is not None}
        if kind == "array":
            if not isinstance(value, list):
                return self._mismatch(value, schema, name, path)
            items = schema.get("items", {})
            return [self.walk(v, items, f"{path}[{i}]") for i, v in enumerate(value)]
        if kind == "string":
            if not isinstance(value, str):
                return self._mismatch(value, schema, name, path)
            if schema.get("format") == "date-time" and not _is_rfc3339(value):
                self.errors.append(
                    f'parsing time "{value}" as "2006-01-02T15:04:05Z07:00": cannot parse')
            return value
        if kind == "integer":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                    isinstance(value, float) and not value.is_integer()):
                return self._mismatch(value, schema, name, path)
            return int(value)
        if kind == "boolean":
            if not isinstance(value, bool):
                return self._mismatch(value, schema, name, path)
            return value
        if kind == "number" and (isinstance(value, bool) or not isinstance(value, (int, float))):
            return self._mismatch(value, schema, name, path)
        return value

    def _struct(self, value: dict[str, Any], schema: dict[str, Any], path: str,
                name: str | None) -> dict[str, Any]:
        struct = (name or "").rsplit(".", 1)[-1]
        props: dict[str, Any] = schema["properties"]
        out: dict[str, Any] = {}
        for key, item in value.items():
            child = f"{path}.{key}" if path else key
            if key not in props or (struct, key) in self.absent:
                self.unknown.append(child)
                if not self.drop_unknown:
                    out[key] = item
                continue
            if item is None:
                continue  # JSON null decodes to the zero value: same as absent
            self.struct = struct
            out[key] = self.walk(item, props[key], child)
        if self.defaults:
            for key, prop in props.items():
                if key not in out and "default" in prop and (struct, key) not in self.absent:
                    default = copy.deepcopy(prop["default"])
                    ref = _ref_name(prop)
                    if isinstance(default, dict) and ref and ref in self.schemas:
                        default = self._struct(default, self.schemas[ref], key, ref)
                    out[key] = default
        return out


_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


def _is_rfc3339(text: str) -> bool:
    if not _RFC3339.match(text):
        return False
    try:
        datetime.fromisoformat(text.replace("z", "Z").replace("t", "T"))
    except ValueError:
        return False
    return True


def decode(obj: dict[str, Any], resource: str, version: str, *,
           absent: Iterable[tuple[str, str]] = (), drop_unknown: bool = True,
           defaults: bool = True, release: str = DEFAULT_RELEASE) -> Decoded:
    """Decode ``obj`` written as ``resource`` in ``version``; nothing of ``obj`` is changed.

    ``apiVersion`` and ``kind`` are kept as sent. Unknown fields (and fields in ``absent``, those
    an older release lacks) are listed with their Go-style path (``spec.devices[0].foo``).
    """
    name = definition_name(version, kind_of(resource))
    walker = _Walker(version, absent, drop_unknown, defaults, release)
    walker.struct = kind_of(resource)
    out = walker._struct(obj, load(version, release)[name], "", name)
    return Decoded(out, walker.unknown, walker.errors)


def encode(obj: dict[str, Any], resource: str, version: str, *,
           absent: Iterable[tuple[str, str]] = (),
           release: str = DEFAULT_RELEASE) -> dict[str, Any]:
    """``obj`` as the server writes it: zero values of non-omitempty fields filled in."""
    return decode(obj, resource, version, absent=absent, drop_unknown=True,
                  release=release).obj


def missing_required(obj: dict[str, Any], resource: str, version: str,
                     release: str = DEFAULT_RELEASE) -> list[str]:
    """Paths the schema marks required but ``obj`` lacks (the server defaults them silently)."""
    schemas = load(version, release)
    found: list[str] = []

    def visit(value: Any, schema: dict[str, Any], path: str) -> None:
        name = _ref_name(schema)
        if name == _QUANTITY:
            return
        if name:
            schema = schemas[name]
        if isinstance(value, dict) and "properties" in schema:
            found.extend(f"{path}.{req}" if path else req
                         for req in schema.get("required", ()) if req not in value)
            for key, item in value.items():
                if key in schema["properties"]:
                    visit(item, schema["properties"][key], f"{path}.{key}" if path else key)
        elif isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
            for key, item in value.items():
                visit(item, schema["additionalProperties"], f"{path}[{key}]")
        elif isinstance(value, list):
            for index, item in enumerate(value):
                visit(item, schema.get("items", {}), f"{path}[{index}]")

    visit(obj, schemas[definition_name(version, kind_of(resource))], "")
    return found
