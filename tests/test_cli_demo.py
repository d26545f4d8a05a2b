"""The demo runs from the checkout, never from an install.

Its code (``compat_tests/``) is in no wheel, so an installed CLI with a ``demo`` command could
only fail; the command left the CLI and ``make demo`` runs ``python -m compat_tests.demo``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.system_tools import needs_tool

REPO = Path(__file__).resolve().parent.parent
VALID = ("serve", "discover", "loader", "healthcheck")


def _installed_cli() -> list[str]:
    """The console script pip installed next to this interpreter (``make test`` installs it)."""
    return [needs_tool("accelerator-device-plugin", "pip install -e . (make test does)",
                       at=Path(sys.executable).parent / "accelerator-device-plugin")]


@pytest.mark.parametrize("args", [["demo"], ["demo", "--node", "migrate"]])
def test_the_installed_cli_has_no_demo_command(args, tmp_path) -> None:
    # Run away from the checkout: an install's view, without compat_tests/ on the path.
    done = subprocess.run([*_installed_cli(), *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert "invalid choice: 'demo'" in line, line
    assert all(f"'{command}'" in line for command in VALID), line


def test_the_installed_packages_import_nothing_from_compat_tests() -> None:
    found = []
    for package in ("plugin", "api_versions"):
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom)
                         and node.level == 0 else [])
                found += [f"{path.relative_to(REPO)}:{node.lineno} imports {name}"
                          for name in names if name.split(".")[0] == "compat_tests"]
    assert not found, found


def test_the_demo_entry_refuses_an_unknown_node_naming_the_known_ones() -> None:
    done = subprocess.run([sys.executable, "-m", "compat_tests.demo", "--node", "nope"],
                          cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and done.stdout == ""
    assert all(f"'{node}'" in done.stderr for node in ("intel", "mixed", "migrate", "program",
                                                           "share"))


def test_make_demo_runs_the_checkout_entry_with_the_node_it_is_given() -> None:
    dry = subprocess.run(["make", "-n", "demo", "DEMO=migrate", "STAMP=/dev/null"], cwd=REPO,
                         capture_output=True, text=True, timeout=60, check=False)
    assert dry.returncode == 0, dry.stderr
    assert "-m compat_tests.demo --node migrate" in dry.stdout
