"""ServiceMonitor and PrometheusRule (monitoring.coreos.com/v1) against prometheus-operator's
own schemas.

They are CRDs, so no Kubernetes release ships their schemas. The npm package
``@kubernetes-models/prometheus-operator`` carries the operator's CRD schemas compiled to
validators (types, enums, duration patterns, required fields); it is installed once with npm
(the registry every install uses) under the user's cache directory and run with node. CRD
schemas do not refuse unknown fields (the API server prunes them without a word), so every
field name the manifests use is also looked up among those the schemas name: a misspelt
``jobLable`` fails here instead of being dropped by the cluster.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

from tests.system_tools import NODE, needs_tool

PACKAGE = "@kubernetes-models/prometheus-operator"
RELEASE = "6.0.0"
GROUP_VERSION = "monitoring.coreos.com/v1"
KINDS = ("ServiceMonitor", "PrometheusRule")
FREE_FORM = {"labels", "annotations", "matchLabels"}
"""Maps whose keys are data, not field names."""
METADATA_FIELDS = {"name", "namespace", "labels", "annotations"}

PREFIX = "ComGithubPrometheusOperatorPrometheusOperatorPkgApisMonitoringV1"
VALIDATE = """
const [dir, prefix, kind, json] = process.argv.slice(1);
const mod = await import(`${dir}/${prefix}${kind}Spec.js`);
const ok = mod.validate(JSON.parse(json));
console.log(JSON.stringify(ok ? [] : mod.validate.errors));
"""


class Unavailable(Exception):
    """The package cannot be installed (a missing npm or node skips, see needs_tool)."""


def cache_root() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "k8s-accelerator-devplugin" / f"prometheus-operator-models-{RELEASE}"


@cache
def schemas_dir() -> Path:
    """The package's compiled validators, installed once (a lock keeps concurrent test
    processes from reading a half-written tree)."""
    npm, _ = needs_tool("npm", NODE), needs_tool("node", NODE)
    root = cache_root()
    marker = root / ".complete"
    if not marker.exists():
        root.parent.mkdir(parents=True, exist_ok=True)
        with open(root.parent / f"{root.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not marker.exists():
                done = subprocess.run(
                    [npm, "install", "--no-audit", "--no-fund", "--ignore-scripts",
                     "--prefix", str(root), f"{PACKAGE}@{RELEASE}"],
                    capture_output=True, text=True, timeout=300, check=False)
                if done.returncode != 0:
                    raise Unavailable(f"npm install {PACKAGE}@{RELEASE}: {done.stderr[-300:]}")
                marker.write_text(RELEASE + "\n")
    return root / "node_modules" / PACKAGE / "_schemas"


@cache
def known_fields() -> frozenset[str]:
    """Every property name the operator's schemas validate, in any of its kinds, and those of
    the label selectors they embed."""
    names: set[str] = set()
    selectors = schemas_dir().parents[1] / "apimachinery" / "_schemas"
    for path in [*schemas_dir().glob("*.js"),
                 *selectors.glob("IoK8sApimachineryPkgApisMetaV1LabelSelector*.js")]:
        names.update(re.findall(r'parentDataProperty:"([A-Za-z_][A-Za-z0-9_]*)"',
                                path.read_text()))
    return frozenset(names)


def unknown_fields(value: Any, path: str = "") -> list[str]:
    """Field names in ``value`` that no schema of the operator names."""
    found: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            here = f"{path}/{key}"
            if key not in known_fields():
                found.append(f"{here}: no such field in prometheus-operator's schemas")
            if key not in FREE_FORM:
                found += unknown_fields(item, here)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += unknown_fields(item, f"{path}/{index}")
    return found


def spec_errors(kind: str, spec: dict[str, Any]) -> list[str]:
    """What the operator's schema for ``kind``'s spec refuses."""
    node = needs_tool("node", NODE)
    done = subprocess.run([node, "--input-type=module", "-e", VALIDATE, str(schemas_dir()),
                           PREFIX, kind, json.dumps(spec)],
                          capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        return [f"node could not run the {kind} validator: {done.stderr[-300:]}"]
    return [f"spec{e['instancePath']}: {e['keyword']} {json.dumps(e['params'])}"
            for e in json.loads(done.stdout)]


def validate(obj: dict[str, Any]) -> list[str]:
    """Every problem prometheus-operator's schemas find in ``obj`` (empty when valid)."""
    if obj.get("apiVersion") != GROUP_VERSION or obj.get("kind") not in KINDS:
        return [f"not a {GROUP_VERSION} {' or '.join(KINDS)}: {obj.get('kind')}"]
    problems = [f"<root>/{k}: unexpected" for k in set(obj) - {"apiVersion", "kind",
                                                                "metadata", "spec"}]
    metadata = obj.get("metadata", {})
    problems += [f"metadata/{k}: unexpected" for k in set(metadata) - METADATA_FIELDS]
    if not metadata.get("name"):
        problems.append("metadata/name: missing")
    if "spec" not in obj:
        return [*problems, "spec: missing"]
    return problems + spec_errors(obj["kind"], obj["spec"]) + unknown_fields(obj["spec"], "spec")
