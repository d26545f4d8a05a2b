"""Fixtures of the deployment checks: rendered kustomizations, schemas, tool binaries."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))

from k8s_schemas import (
    OLD_VERSIONS,
    SchemaSet,
    fetch_old_schemas,
    installed_dir,
    installed_versions,
)

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

# Every kustomization the project ships, and the oldest Kubernetes it is meant for.
KUSTOMIZATIONS = {
    "base": (REPO / "deploy" / "base", "1.21"),
    "intel": (REPO / "deploy" / "overlays" / "intel", "1.21"),
    "aws": (REPO / "deploy" / "overlays" / "aws", "1.21"),
    "legacy": (REPO / "deploy" / "overlays" / "legacy", "1.11"),
    "kind": (REPO / "compat_tests" / "kind", "1.21"),
}


def tool(name: str) -> str:
    """A linter binary from this venv (test extra) or PATH; fail, never skip, when absent."""
    for candidate in (BIN / name, shutil.which(name)):
        if candidate and os.access(candidate, os.X_OK):
            return str(candidate)
    pytest.fail(f"{name} is not installed: `pip install -e '.[test]'` provides it")


@pytest.fixture(scope="session")
def kubectl() -> str:
    found = shutil.which("kubectl")
    if found is None:
        pytest.fail("kubectl not found: .ci/run installs it (Debian package kubernetes-client)")
    return found


def render(kubectl: str, directory: Path) -> list[dict[str, Any]]:
    done = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, f"kubectl kustomize {directory} failed:\n{done.stderr}"
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc is not None]


@pytest.fixture(scope="session")
def rendered(kubectl: str) -> dict[str, list[dict[str, Any]]]:
    return {name: render(kubectl, path) for name, (path, _) in KUSTOMIZATIONS.items()}


def minor(version: str) -> int:
    return int(version.split(".")[1])


@pytest.fixture(scope="session")
def schema_sets() -> list[SchemaSet]:
    """Strict schemas of Kubernetes 1.11 .. newest the installed kubernetes-validate ships."""
    try:
        old_root = fetch_old_schemas()
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        output = getattr(exc, "stderr", "") or ""
        pytest.skip(f"cannot fetch kubernetes-validate's 1.11-1.24 schemas from the package "
                    f"registry: {exc} {output[-300:]}")
    sets = [SchemaSet(v, old_root / f"v{v}.0-local-strict") for v in OLD_VERSIONS]
    sets += [SchemaSet(v, installed_dir(v)) for v in installed_versions()]
    return sets


def load_yaml_file(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
