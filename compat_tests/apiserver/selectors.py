"""``fieldSelector`` and ``labelSelector`` query parameters, parsed and matched as the server does.

Field selectors are ``key=value``, ``key==value`` or ``key!=value`` terms joined by commas (all
must hold), keys limited to the kind's field labels (resources.py). Label selectors also take
``key``, ``!key``, ``key in (a,b)`` and ``key notin (a,b)``. Grammar from apimachinery
``pkg/fields/selector.go`` and ``pkg/labels/selector.go``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from compat_tests.apiserver import errors
from compat_tests.apiserver.resources import ResourceInfo, field_label_error

Obj = dict[str, Any]
Predicate = Callable[[Obj], bool]


def _split_terms(text: str) -> list[str]:
    terms, depth, current = [], 0, ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            terms.append(current.strip())
            current = ""
        else:
            current += char
    if current.strip():
        terms.append(current.strip())
    return terms


def field_terms(text: str) -> list[tuple[str, str, str]]:
    """[(key, "=" or "!=", value)] of a field selector; ApiError 400 if malformed."""
    out = []
    for term in _split_terms(text):
        match = re.fullmatch(r"([^=!\s]+)\s*(==|=|!=)\s*(.*)", term)
        if match is None:
            raise errors.bad_request(f"invalid selector: '{text}'; can't understand '{term}'")
        key, op, value = match.groups()
        out.append((key, "!=" if op == "!=" else "=", value.replace("\\,", ",")))
    return out


def field_predicate(info: ResourceInfo, version: str, text: str) -> Predicate:
    terms = field_terms(text)
    for key, _, _ in terms:
        if key not in info.field_labels:
            raise errors.bad_request(field_label_error(info, version, key))

    def match(obj: Obj) -> bool:
        return all((info.field_value(obj, k) == v) == (op == "=") for k, op, v in terms)

    return match


def label_predicate(text: str) -> Predicate:
    checks: list[Callable[[dict[str, str]], bool]] = []
    for term in _split_terms(text):
        set_match = re.fullmatch(r"(\S+)\s+(in|notin)\s+\((.*)\)", term)
        if set_match:
            key, op, raw = set_match.groups()
            values = {v.strip() for v in raw.split(",") if v.strip()}
            if op == "in":
                checks.append(lambda labels, k=key, vs=values: labels.get(k) in vs)
            else:
                checks.append(lambda labels, k=key, vs=values: labels.get(k) not in vs)
            continue
        eq = re.fullmatch(r"([^=!\s]+)\s*(==|=|!=)\s*(.*)", term)
        if eq:
            key, op, value = eq.groups()
            if op == "!=":
                checks.append(lambda labels, k=key, v=value: labels.get(k) != v)
            else:
                checks.append(lambda labels, k=key, v=value: labels.get(k) == v)
            continue
        exists = re.fullmatch(r"(!?)\s*([A-Za-z0-9][-A-Za-z0-9_./]*)", term)
        if exists is None:
            raise errors.bad_request(f"unable to parse requirement: {term!r}")
        negate, key = exists.groups()
        if negate:
            checks.append(lambda labels, k=key: k not in labels)
        else:
            checks.append(lambda labels, k=key: k in labels)

    def match(obj: Obj) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        return all(check(labels) for check in checks)

    return match


def predicate(info: ResourceInfo, version: str, query: Any) -> Predicate:
    """The combined selector of a request's query (a mapping of parameter to value)."""
    field_text, label_text = query.get("fieldSelector", ""), query.get("labelSelector", "")
    field_match = field_predicate(info, version, field_text) if field_text else None
    label_match = label_predicate(label_text) if label_text else None

    def match(obj: Obj) -> bool:
        return (field_match is None or field_match(obj)) and (
            label_match is None or label_match(obj))

    return match
