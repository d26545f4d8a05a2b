"""The resource.k8s.io versions this driver speaks, newest first, and the pick among them.

A 1.32 or 1.33 API server serves v1beta1 (and v1beta2 from 1.33) only when an administrator
turns them on; 1.34 to 1.36 serve v1 alone by default (k/k ``pkg/controlplane/instance.go``
per release). So the driver reads the group's discovery document
(``GET /apis/resource.k8s.io``, a ``metav1.APIGroup``) and takes the newest version both sides
know, as the Go helper's client does by trying v1, v1beta2, v1beta1 in turn.

"Newest" is Kubernetes' order, not PEP 440's: every GA version before every beta, every beta
before every alpha, then by major and minor number (apimachinery ``pkg/version/helpers.go``,
``CompareKubeAwareVersionStrings``: v2, v1, v1beta2, v1beta1, v1alpha1).
``packaging.version.Version`` reads ``v1beta2`` as ``1b2`` and would put a future ``v2beta1``
above ``v1``, which Kubernetes does not.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

GROUP = "resource.k8s.io"
_KUBE_VERSION = re.compile(r"^v([1-9][0-9]*)(?:(alpha|beta)([1-9][0-9]*))?$")
_STABILITY = {None: 2, "beta": 1, "alpha": 0}


def version_key(version: str) -> tuple[int, int, int, str]:
    """Sort key, ascending from oldest to newest; a string that is not a Kubernetes version
    (``v1.DRAPlugin``, ``v0``) sorts below every version, as upstream sorts them."""
    match = _KUBE_VERSION.match(version)
    if match is None:
        return (-1, 0, 0, version)
    major, stability, minor = match.groups()
    return (_STABILITY[stability], int(major), int(minor or 0), "")


def newest_first(versions: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(set(versions), key=version_key, reverse=True))


KNOWN_VERSIONS: tuple[str, ...] = newest_first(("v1", "v1beta2", "v1beta1"))
"""The resource.k8s.io versions whose ResourceSlice and ResourceClaim shapes are built here."""


def api_version(version: str) -> str:
    """``resource.k8s.io/<version>`` for a known version; ValueError naming the known ones."""
    check_known(version)
    return f"{GROUP}/{version}"


def check_known(version: str) -> None:
    if version not in KNOWN_VERSIONS:
        raise ValueError(f"resource.k8s.io version {version!r} is not one of "
                         f"{', '.join(KNOWN_VERSIONS)}")


def served_versions(group: Mapping[str, Any]) -> tuple[str, ...]:
    """Every version an ``APIGroup`` document lists, newest first.

    Raises ValueError naming the field when the document is not one for resource.k8s.io.
    """
    if not isinstance(group, Mapping):
        raise ValueError("discovery document: expected a JSON object (an APIGroup)")
    if group.get("kind", "APIGroup") != "APIGroup":
        raise ValueError(f"discovery document: kind is {group.get('kind')!r}, not 'APIGroup'")
    if group.get("name") != GROUP:
        raise ValueError(f"discovery document: name is {group.get('name')!r}, not {GROUP!r}")
    entries = group.get("versions")
    if not isinstance(entries, list):
        raise ValueError("discovery document: versions: expected a list")
    found = []
    for index, entry in enumerate(entries):
        version = entry.get("version") if isinstance(entry, Mapping) else None
        if not isinstance(version, str) or not version:
            raise ValueError(f"discovery document: versions[{index}].version: expected a "
                             "non-empty string")
        found.append(version)
    return newest_first(found)


def pick_version(group: Mapping[str, Any],
                 known: Iterable[str] = KNOWN_VERSIONS) -> str | None:
    """The newest version the server serves and this driver knows; None if there is none.

    The server's ``preferredVersion`` is not followed: it is for clients without a preference
    of their own, and this driver prefers the newest shape both sides understand (the two
    agree on every release so far: 1.32 prefers v1beta1, 1.33 v1beta2, 1.34 on v1).
    """
    ours = set(known)
    return next((v for v in served_versions(group) if v in ours), None)
