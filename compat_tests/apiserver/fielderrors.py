"""Field errors worded as the API server words them, and the string formats its rules check.

A 422 Invalid Status carries one cause per field error and a message that joins them; a driver's
log or a test that matches on it should see the server's exact text. The wording comes from
apimachinery ``pkg/util/validation/field/errors.go`` (ErrorBody, TooLong, TooMany, NotSupported),
``pkg/util/validation/validation.go`` (DNS labels and subdomains) and
``pkg/api/validate/content/{identifier,kube}.go`` (C identifiers, label keys and values).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

OMIT = object()
"""A bad value that is not shown (``field.TooMany`` with an unknown count)."""

_TYPE_TEXT = {
    "FieldValueNotFound": "Not found", "FieldValueRequired": "Required value",
    "FieldValueDuplicate": "Duplicate value", "FieldValueInvalid": "Invalid value",
    "FieldValueNotSupported": "Unsupported value", "FieldValueForbidden": "Forbidden",
    "FieldValueTooLong": "Too long", "FieldValueTooMany": "Too many",
}
_NO_VALUE = {"FieldValueRequired", "FieldValueForbidden", "FieldValueTooLong"}


def go_value(value: Any) -> str:
    """How Go's field errors print a bad value: %q for strings, %v for scalars, else JSON."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


@dataclass(frozen=True)
class FieldError:
    """One ``field.Error``: its cause type, field path, bad value and detail."""

    type: str
    field: str
    value: Any = OMIT
    detail: str = ""

    def body(self) -> str:
        text = _TYPE_TEXT.get(self.type, self.type)
        if self.type not in _NO_VALUE and self.value is not OMIT:
            text = f"{text}: {go_value(self.value)}"
        return f"{text}: {self.detail}" if self.detail else text

    def __str__(self) -> str:
        return f"{self.field}: {self.body()}"

    def cause(self) -> dict[str, str]:
        return {"reason": self.type, "message": self.body(), "field": self.field}


def required(path: str, detail: str = "") -> FieldError:
    return FieldError("FieldValueRequired", path, "", detail)


def invalid(path: str, value: Any, detail: str) -> FieldError:
    return FieldError("FieldValueInvalid", path, value, detail)


def forbidden(path: str, detail: str) -> FieldError:
    return FieldError("FieldValueForbidden", path, "", detail)


def duplicate(path: str, value: Any) -> FieldError:
    return FieldError("FieldValueDuplicate", path, value)


def not_supported(path: str, value: Any, valid: tuple[str, ...]) -> FieldError:
    detail = "supported values: " + ", ".join(json.dumps(v) for v in valid) if valid else ""
    return FieldError("FieldValueNotSupported", path, value, detail)


def too_long(path: str, max_length: int) -> FieldError:
    unit = "byte" if max_length == 1 else "bytes"
    return FieldError("FieldValueTooLong", path, "<value omitted>",
                      f"may not be more than {max_length} {unit}")


def too_many(path: str, actual: int, maximum: int) -> FieldError:
    unit = "item" if maximum == 1 else "items"
    return FieldError("FieldValueTooMany", path, actual, f"must have at most {maximum} {unit}")


def aggregate(errors: list[FieldError]) -> str:
    """``errs.ToAggregate().Error()``: one message, or ``[a, b]`` with duplicates removed."""
    seen: list[str] = []
    for err in errors:
        if str(err) not in seen:
            seen.append(str(err))
    return seen[0] if len(seen) == 1 else "[" + ", ".join(seen) + "]"


# --- string formats -------------------------------------------------------------------------

_LABEL_FMT = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN_FMT = _LABEL_FMT + "(\\." + _LABEL_FMT + ")*"
_LABEL_MSG = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters "
              "or '-', and must start and end with an alphanumeric character")
_SUBDOMAIN_MSG = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                  "characters, '-' or '.', and must start and end with an alphanumeric character")
_CID_FMT = "[A-Za-z_][A-Za-z0-9_]*"
_CID_MSG = ("a valid C identifier must start with alphabetic character or '_', followed by a "
            "string of alphanumeric characters or '_'")
_KEY_FMT = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_KEY_MSG = ("must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
            "with an alphanumeric character")
_VALUE_FMT = "(" + _KEY_FMT + ")?"
_VALUE_MSG = ("a valid label must be an empty string or consist of alphanumeric characters, "
              "'-', '_' or '.', and must start and end with an alphanumeric character")
_SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(-(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(\.(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*)?"
    r"(\+[0-9a-zA-Z-]+(\.[0-9a-zA-Z-]+)*)?")


def regex_error(msg: str, fmt: str, *examples: str) -> str:
    if not examples:
        return f"{msg} (regex used for validation is '{fmt}')"
    shown = " or ".join(f"'{e}'" for e in examples)
    return f"{msg} (e.g. {shown}, regex used for validation is '{fmt}')"


def _full(fmt: str, value: str) -> bool:
    return re.fullmatch(fmt, value) is not None


def dns1123_label(value: str) -> list[str]:
    errs = []
    if len(value) > 63:
        errs.append("must be no more than 63 characters")
    if not _full(_LABEL_FMT, value):
        if _full(_SUBDOMAIN_FMT, value):
            errs.append("must not contain dots")
        else:
            errs.append(regex_error(_LABEL_MSG, _LABEL_FMT, "my-name", "123-abc"))
    return errs


def dns1123_subdomain(value: str) -> list[str]:
    errs = []
    if len(value) > 253:
        errs.append("must be no more than 253 characters")
    if not _full(_SUBDOMAIN_FMT, value):
        errs.append(regex_error(_SUBDOMAIN_MSG, _SUBDOMAIN_FMT, "example.com"))
    return errs


def c_identifier(value: str) -> list[str]:
    if _full(_CID_FMT, value):
        return []
    return [regex_error(_CID_MSG, _CID_FMT, "my_name", "MY_NAME", "MyName")]


def label_key(value: str) -> list[str]:
    """``content.IsLabelKey`` (also IsQualifiedName): ``[prefix/]name``."""
    errs: list[str] = []
    parts = value.split("/")
    if len(parts) > 2:
        return ["a valid label key " + regex_error(_KEY_MSG, _KEY_FMT, "MyName", "my.name",
                                                   "123-abc")
                + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"]
    name = parts[-1]
    if len(parts) == 2:
        if not parts[0]:
            errs.append("prefix part must be non-empty")
        else:
            errs.extend("prefix part " + m for m in dns1123_subdomain(parts[0]))
    if not name:
        errs.append("name part must be non-empty")
    elif len(name) > 63:
        errs.append("name part must be no more than 63 characters")
    if not _full(_KEY_FMT, name):
        errs.append("name part " + regex_error(_KEY_MSG, _KEY_FMT, "MyName", "my.name",
                                               "123-abc"))
    return errs


def label_value(value: str) -> list[str]:
    errs = []
    if len(value) > 63:
        errs.append("must be no more than 63 characters")
    if not _full(_VALUE_FMT, value):
        errs.append(regex_error(_VALUE_MSG, _VALUE_FMT, "MyValue", "my_value", "12345"))
    return errs


def is_semver(value: str) -> bool:
    return _SEMVER.fullmatch(value) is not None
