"""Fixtures of the deployment checks: rendered kustomizations and Kubernetes schemas."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import monitoring_schemas
from deploy_support import COMBINATIONS, KUSTOMIZATIONS, render, write_kustomization
from k8s_schemas import (
    OLD_VERSIONS,
    SchemaSet,
    fetch_old_schemas,
    installed_dir,
    installed_versions,
)

from tests.system_tools import KUBECTL, needs_tool

DOWNLOADS_FOR = ("test_deploy_monitoring.py", "test_deploy_programming.py", "test_helm_chart.py",
                 "test_helm_parity.py", "test_helm_pools.py")
"""Modules that check monitoring.coreos.com objects, some without the schema_sets fixture."""


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Fill the two download caches before any test's clock starts.

    kubernetes-validate's 1.11-1.24 schemas (about 25 s on a fresh machine) and
    prometheus-operator's validators (about 10 s), each four times that on a loaded machine,
    would otherwise be paid inside the 120 s of whichever test needs them first. Both are
    kept under the user's cache directory, so this costs nothing once they are there. A
    download that fails here is left to the test that needs it, which then says why. Runs
    last, after ``-k`` and ``-m`` have deselected what they will."""
    needed = any(getattr(item, "path", Path()).name in DOWNLOADS_FOR
                 or "schema_sets" in getattr(item, "fixturenames", ()) for item in items)
    if not needed:
        return
    with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
        fetch_old_schemas()
    with contextlib.suppress(monitoring_schemas.Unavailable, pytest.skip.Exception,
                             pytest.fail.Exception):
        monitoring_schemas.schemas_dir()


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
