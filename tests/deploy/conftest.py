"""Fixtures of the deployment checks: rendered kustomizations and Kubernetes schemas."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from deploy_support import COMBINATIONS, KUSTOMIZATIONS, render, write_kustomization
from k8s_schemas import (
    OLD_VERSIONS,
    SchemaSet,
    fetch_old_schemas,
    installed_dir,
    installed_versions,
)

from tests.system_tools import KUBECTL, needs_tool


@pytest.fixture(scope="session")
def kubectl() -> str:
    return needs_tool("kubectl", KUBECTL)


@pytest.fixture(scope="session")
def rendered(kubectl: str, tmp_path_factory: pytest.TempPathFactory
             ) -> dict[str, list[dict[str, Any]]]:
    """Every shipped kustomization and every combination of COMBINATIONS, rendered."""
    found = {name: render(kubectl, path) for name, (path, _) in KUSTOMIZATIONS.items()}
    root = tmp_path_factory.mktemp("combinations")
    for name, (components, _) in COMBINATIONS.items():
        found[name] = render(kubectl, write_kustomization(root / name, components))
    return found


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
