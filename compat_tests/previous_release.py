"""The previous release's code, taken from git history, to run beside this one.

Why from history: a rollback runs the previous release's reader on the files this release
wrote (and the other way round on the next upgrade), so what the compatibility tests must
run is that release's code as it shipped, not a description of it. The repository has no
tags, so the release is named by its commit (CHANGELOG.md ``[0.1.0]``). The tree is
extracted with ``git archive`` (a fresh clone has the full history); its wire descriptors
are generated from its own ``protos/`` when ``grpc_tools`` is at hand, and otherwise taken
from this tree's build for each proto that is byte-identical in both. Where git, the commit
or a way to build its descriptors is missing, the tests that need it are skipped, saying why
(a missing git fails them under ``CI=true``, as every missing tool does: tests/system_tools.py).
"""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.system_tools import GIT, needs_tool

PREVIOUS_RELEASE = "0.1.0"
PREVIOUS_COMMIT = "c6855bd01490b6408f057cfd4570b73fc9742f42"
"""The commit of release 0.1.0 (CHANGELOG.md ``[0.1.0]``: "version: one place the running
build reads its version from")."""
BEFORE_SHARES = "0.2.0"
BEFORE_SHARES_COMMIT = "dd8b628cfb50c4bcccdc1a77b5c7c94ca816a07e"
"""The last commit before the driver prepared shares of devices: its claim checkpoint reads
major format 2 only, as 0.2.0's does (what a rollback from sharing meets)."""
ROOT = Path(__file__).resolve().parent.parent
PARTS = ("plugin", "api_versions", "protos", "build_support")
"""What ``python -m plugin serve`` of that release imports (and how its wire types build)."""
LATER_PARTS = (*PARTS, "value_types")
"""The same from the commit that moved the shared values into ``value_types`` on."""


def previous_release_tree(destination: Path, release: str = PREVIOUS_RELEASE,
                          commit: str = PREVIOUS_COMMIT,
                          parts: tuple[str, ...] = PARTS) -> Path:
    """The source tree of ``release`` (by default the previous one) at ``commit``, under
    ``destination`` (pytest.skip if it cannot be had)."""
    tree = destination / f"release-{release}"
    if (tree / "plugin" / "__main__.py").exists():
        return tree
    git = needs_tool("git", GIT)
    found = subprocess.run([git, "-C", str(ROOT), "cat-file", "-e",
                            f"{commit}^{{commit}}"], capture_output=True)
    if found.returncode != 0:
        pytest.skip(f"commit {commit[:7]} (release {release}) is not in "
                    f"this repository's history (a shallow clone?): "
                    f"{found.stderr.decode(errors='replace').strip()}")
    archive = subprocess.run([git, "-C", str(ROOT), "archive", "--format=tar",
                              commit, *parts], capture_output=True, check=True)
    tree.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        if hasattr(tarfile, "data_filter"):  # Python 3.11.4 and later
            tar.extractall(tree, filter="data")
        else:  # our own repository's archive
            tar.extractall(tree)
    _descriptors(tree, release)
    _check_imported_from(tree, parts)
    return tree


def _check_imported_from(tree: Path, parts: tuple[str, ...] = PARTS) -> None:
    """``python -m plugin`` run in ``tree`` imports that tree's packages, not the ones this
    virtualenv has installed (editable installs add an import hook of their own)."""
    modules = ["plugin.serving.dra.checkpoint", *(["value_types.claims"]
                                                  if "value_types" in parts else [])]
    for module in modules:
        found = subprocess.run(
            [sys.executable, "-c", f"import {module} as m; print(m.__file__)"],
            cwd=tree, capture_output=True, text=True, check=True).stdout.strip()
        assert Path(found).is_relative_to(tree), f"the release's code is not what runs: {found}"


def _descriptors(tree: Path, release: str = PREVIOUS_RELEASE) -> None:
    """``api_versions/_generated`` of the old tree: compiled from its protos, or this tree's
    build of each proto that did not change."""
    try:
        import grpc_tools  # noqa: F401  (build-time only: present only if installed)
    except ImportError:
        pass
    else:
        subprocess.run([sys.executable, "-c", "from build_support.backend import "
                        "generate_descriptors; generate_descriptors()"], cwd=tree, check=True)
        return
    built = ROOT / "api_versions" / "_generated"
    out = tree / "api_versions" / "_generated"
    out.mkdir()
    shutil.copy2(built / "__init__.py", out / "__init__.py")
    for proto in sorted((tree / "protos").glob("*/api.proto")):
        ours = ROOT / "protos" / proto.parent.name / "api.proto"
        if not ours.exists() or ours.read_bytes() != proto.read_bytes():
            pytest.skip(f"protos/{proto.parent.name}/api.proto changed since release "
                        f"{release} and grpc_tools is not installed to build it")
        shutil.copy2(built / f"{proto.parent.name}.binpb", out)
