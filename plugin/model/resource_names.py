"""Kubernetes extended-resource name rules, checked here so a bad name fails at start-up.

The kubelet refuses a bad name at every Register; catching it before serving turns an
endless retry loop into one clear error.
"""

from __future__ import annotations

import re

_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def dns_subdomain_problem(text: str) -> str | None:
    """Why ``text`` is not a DNS subdomain (a resource prefix, a node or DRA driver name)."""
    if not text or len(text) > 253 or not all(_DNS_LABEL.match(p) for p in text.split(".")):
        return f"{text!r} is not a DNS subdomain (lower-case letters, digits, '-' and '.')"
    return None


def resource_name_problem(name: str) -> str | None:
    """Why ``name`` is not a valid device-plugin resource name, or None if it is."""
    if name.count("/") != 1:
        return f"{name!r} must be <domain>/<name> with exactly one '/'"
    prefix, short = name.split("/")
    if prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io"):
        return f"{name!r}: the kubernetes.io domain is reserved"
    if dns_subdomain_problem(prefix):
        return f"{name!r}: {prefix!r} is not a DNS subdomain"
    if not short or len(short) > 63 or not _NAME.match(short):
        return (
            f"{name!r}: {short!r} must be at most 63 characters of [A-Za-z0-9-_.], "
            "starting and ending with a letter or digit"
        )
    return None
