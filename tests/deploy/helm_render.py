"""The Helm chart under deploy/helm, rendered by Helm's own Go engine (the Helm 4 SDK bound by
the ``helm-python-sdk`` package), and the structural schemas of the Prometheus Operator
objects it may render.

Rendering is ``helm install --dry-run=client`` run through the SDK, which is ``helm
template``: the chart's kubeVersion is checked against the Kubernetes version given, values
are validated against values.schema.json, and nothing contacts a cluster. The package's
Python wrapper does not pass ``kube_version`` to an install, so the call is made through its
native binding with the options the C API documents (``kube_version``, ``dry_run``).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import monitoring_schemas
import yaml
from deploy_support import REPO, documents

CHART = REPO / "deploy" / "helm" / "accelerator-device-plugin"
EXAMPLES = CHART / "examples"
RELEASE = "accelerator-device-plugin"
NEWEST_HELPER_VERSION = "1.37"


class HelmRefused(Exception):
    """Helm refused to render: the message is Helm's, naming the value or template."""


def _helm() -> Any:
    import helm_python

    return helm_python


def example_names() -> list[str]:
    return sorted(p.stem for p in EXAMPLES.glob("*.yaml"))


def example_values(name: str) -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text()) or {}


def render(
    values: dict[str, Any] | None = None,
    *,
    namespace: str = "kube-system",
    release: str = RELEASE,
    kube_version: str = NEWEST_HELPER_VERSION,
) -> list[dict[str, Any]]:
    """Every object the chart renders for ``values``, in Helm's install order."""
    helm = _helm()
    from helm_python import _native

    options = {"dry_run": "client", "namespace": namespace,
               "kube_version": f"v{kube_version}.0"}
    with helm.Config(storage_driver="memory", namespace=namespace) as config:
        try:
            payload = _native.call_string(
                "helm_install", config._raw(), _native.HANDLE(0), _native.HANDLE(0),
                str(CHART), release, json.dumps(values or {}), json.dumps(options),
            )
        except helm.HelmError as exc:
            raise HelmRefused(str(exc)) from exc
    manifest = json.loads(payload)["manifest"]
    return documents(manifest)


def lint(values: dict[str, Any] | None = None, *, kube_version: str = NEWEST_HELPER_VERSION,
         chart: Path = CHART) -> list[dict[str, Any]]:
    """``helm lint --strict``'s findings above info level (severity 2 warning, 3 error)."""
    report = _helm().lint(str(chart), values or {}, strict=True, kube_version=f"v{kube_version}.0",
                          namespace="kube-system")
    return [m for m in report["messages"] if m["severity"] >= 2]


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = of_kind(objects, kind)
    return found


def config_file(objects: list[dict[str, Any]], daemonset: dict[str, Any]) -> dict[str, Any]:
    """The config.yaml the DaemonSet's pods read, parsed."""
    spec = daemonset["spec"]["template"]["spec"]
    (volume,) = [v for v in spec["volumes"] if "configMap" in v]
    (config_map,) = [o for o in of_kind(objects, "ConfigMap")
                     if o["metadata"]["name"] == volume["configMap"]["name"]]
    parsed: dict[str, Any] = yaml.safe_load(config_map["data"]["config.yaml"])
    return parsed


# --- the Prometheus Operator's objects ----------------------------------------------------


def validate_monitoring(obj: dict[str, Any]) -> list[str]:
    """What prometheus-operator's own schemas (and a check for fields they would leave
    unchecked) find wrong in a ServiceMonitor or PrometheusRule: the same check the kustomize
    monitoring component gets, so chart and kustomize answer to one schema. The same object
    is checked once, however many Kubernetes releases a test walks."""
    return list(_validate_monitoring(json.dumps(obj, sort_keys=True)))


@cache
def _validate_monitoring(text: str) -> tuple[str, ...]:
    return tuple(monitoring_schemas.validate(json.loads(text)))
