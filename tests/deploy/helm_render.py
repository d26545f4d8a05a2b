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
from pathlib import Path
from typing import Any

import yaml
from deploy_support import REPO

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
    return [doc for doc in yaml.safe_load_all(manifest) if doc is not None]


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


# --- structural schemas of the Prometheus Operator's objects --------------------------------
#
# The CRDs are not part of Kubernetes, so no schema set has them. These say which fields of
# monitoring.coreos.com/v1 the chart may use and of what type, closed (additionalProperties
# false) wherever the chart writes, so a misspelt or misplaced field is caught as an API server
# with the CRDs installed would prune or refuse it.

_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_METADATA = {
    "type": "object", "required": ["name", "namespace"], "additionalProperties": False,
    "properties": {"name": {"type": "string"}, "namespace": {"type": "string"},
                   "labels": _STRING_MAP, "annotations": _STRING_MAP},
}
_DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?"
                                          r"(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
_RELABEL = {
    "type": "object", "additionalProperties": False,
    "properties": {
        "action": {"enum": ["replace", "Replace", "keep", "Keep", "drop", "Drop", "hashmod",
                            "labelmap", "labeldrop", "labelkeep", "lowercase", "uppercase",
                            "keepequal", "dropequal"]},
        "sourceLabels": {"type": "array", "items": {"type": "string"}},
        "separator": {"type": "string"}, "targetLabel": {"type": "string"},
        "regex": {"type": "string"}, "modulus": {"type": "integer"},
        "replacement": {"type": "string"},
    },
}
SERVICE_MONITOR = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": _METADATA,
        "spec": {
            "type": "object", "required": ["selector", "endpoints"], "additionalProperties": False,
            "properties": {
                "jobLabel": {"type": "string"},
                "namespaceSelector": {
                    "type": "object", "additionalProperties": False,
                    "properties": {"any": {"type": "boolean"},
                                   "matchNames": {"type": "array", "items": {"type": "string"}}},
                },
                "selector": {
                    "type": "object", "additionalProperties": False,
                    "properties": {"matchLabels": _STRING_MAP,
                                   "matchExpressions": {"type": "array"}},
                },
                "endpoints": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "additionalProperties": False,
                    "properties": {
                        "port": {"type": "string"}, "targetPort": {"type": ["string", "integer"]},
                        "path": {"type": "string"}, "scheme": {"enum": ["http", "https"]},
                        "interval": _DURATION, "scrapeTimeout": _DURATION,
                        "honorLabels": {"type": "boolean"},
                        "relabelings": {"type": "array", "items": _RELABEL},
                        "metricRelabelings": {"type": "array", "items": _RELABEL},
                    },
                }},
            },
        },
    },
}
_RULE = {
    "type": "object", "required": ["expr"], "additionalProperties": False,
    "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
    "properties": {
        "alert": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
        "record": {"type": "string"},
        "expr": {"type": ["string", "integer"], "minLength": 1},
        "for": _DURATION, "keep_firing_for": _DURATION,
        "labels": _STRING_MAP, "annotations": _STRING_MAP,
    },
}
PROMETHEUS_RULE = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": _METADATA,
        "spec": {
            "type": "object", "required": ["groups"], "additionalProperties": False,
            "properties": {"groups": {"type": "array", "items": {
                "type": "object", "required": ["name", "rules"], "additionalProperties": False,
                "properties": {"name": {"type": "string", "minLength": 1},
                               "interval": _DURATION,
                               "rules": {"type": "array", "items": _RULE}},
            }}},
        },
    },
}
MONITORING_SCHEMAS = {"ServiceMonitor": SERVICE_MONITOR, "PrometheusRule": PROMETHEUS_RULE}


def validate_monitoring(obj: dict[str, Any]) -> list[str]:
    import jsonschema

    validator = jsonschema.Draft7Validator(MONITORING_SCHEMAS[obj["kind"]])
    return [f"{'/'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message[:300]}"
            for e in validator.iter_errors(obj)]
