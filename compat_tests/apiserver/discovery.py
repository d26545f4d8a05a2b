"""Discovery documents: what ``/version``, ``/api``, ``/apis``, a group and a group version say.

A client learns from these which resource.k8s.io versions exist before it picks one, so they
change with the model and its runtime config exactly as a real server's do: a version not served
is absent from ``/apis`` and its ``/apis/resource.k8s.io/<version>`` is a 404. Shapes are
``metav1.APIGroupList``, ``APIGroup``, ``APIResourceList``, ``APIVersions`` and ``version.Info``
(apimachinery). The aggregated discovery format (``apidiscovery.k8s.io/v2``) is not served; clients
that ask for it fall back to these, as they do with older servers.
"""

from __future__ import annotations

from typing import Any

from compat_tests.apiserver import events as events_api
from compat_tests.apiserver.models import GROUP, ServerModel
from compat_tests.apiserver.resources import (
    NODES,
    RESOURCES,
    STATUS_VERBS,
    VERBS,
    ResourceInfo,
    storage_version_hash,
)


def version_info(model: ServerModel) -> dict[str, Any]:
    return {
        "major": "1", "minor": str(model.minor),
        "emulationMajor": "1", "emulationMinor": str(model.minor),
        "minCompatibilityMajor": "1", "minCompatibilityMinor": str(model.minor - 1),
        "gitVersion": model.git_version, "gitCommit": "0" * 40, "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.25.0", "compiler": "gc",
        "platform": "linux/amd64",
    }


def api_versions(address: str) -> dict[str, Any]:
    return {"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}]}


def _group(model: ServerModel) -> dict[str, Any] | None:
    preferred = model.preferred_version
    if preferred is None:
        return None

    def entry(version: str) -> dict[str, str]:
        return {"groupVersion": f"{GROUP}/{version}", "version": version}

    return {"name": GROUP, "versions": [entry(v) for v in model.served],
            "preferredVersion": entry(preferred)}


def group_list(model: ServerModel) -> dict[str, Any]:
    group = _group(model)
    return {"kind": "APIGroupList", "apiVersion": "v1",
            "groups": ([group] if group else []) + [events_api.group()]}


def events_group() -> dict[str, Any]:
    return {"kind": "APIGroup", "apiVersion": "v1", **events_api.group()}


def events_resource_list() -> dict[str, Any]:
    """events.k8s.io/v1, served by every release modelled (GA since 1.19)."""
    info = events_api.EVENTS
    return {"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": f"{events_api.GROUP}/{events_api.VERSION}",
            "resources": [_resource_entry(info, events_api.VERSION, events_api.VERSION)]}


def group(model: ServerModel) -> dict[str, Any] | None:
    found = _group(model)
    return {"kind": "APIGroup", "apiVersion": "v1", **found} if found else None


def _resource_entry(info: ResourceInfo, version: str, storage: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": info.name, "singularName": info.singular,
                             "namespaced": info.namespaced, "kind": info.kind,
                             "verbs": list(VERBS)}
    if info.short_names:
        entry["shortNames"] = list(info.short_names)
    entry["storageVersionHash"] = storage_version_hash(info.group, storage, info.kind)
    return entry


def _status_entry(info: ResourceInfo) -> dict[str, Any]:
    return {"name": f"{info.name}/status", "singularName": "", "namespaced": info.namespaced,
            "kind": info.kind, "verbs": list(STATUS_VERBS)}


def resource_list(model: ServerModel, version: str) -> dict[str, Any] | None:
    if not model.serves(version):
        return None
    storage = "v1" if "v1" in model.compiled else "v1beta1"
    resources: list[dict[str, Any]] = []
    for info in sorted(RESOURCES.values(), key=lambda i: i.name):
        resources.append(_resource_entry(info, version, storage))
        if info.status:
            resources.append(_status_entry(info))
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{GROUP}/{version}",
            "resources": resources}


def core_resource_list() -> dict[str, Any]:
    nodes = _resource_entry(NODES, "v1", "v1")
    return {"kind": "APIResourceList", "groupVersion": "v1",
            "resources": [nodes, _status_entry(NODES)]}
