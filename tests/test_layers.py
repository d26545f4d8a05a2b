"""Imports point down the layers: a module never imports a package drawn above it.

From the floor up: ``value_types`` (the values every layer speaks: devices, claims, results,
health reports), ``api_versions`` (wire <-> value adapters), ``plugin`` (discovery, the model,
serving, the process, the command line), and ``compat_tests`` (emulators and tests), which
nothing installed may need. Every import counts, including those inside functions and under
``TYPE_CHECKING``: a lazy import still makes the lower package unreadable without the upper.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

FORBIDDEN: dict[str, tuple[str, ...]] = {
    "value_types": ("api_versions", "plugin", "compat_tests", "tests", "bench"),
    "api_versions": ("plugin", "compat_tests", "tests", "bench"),
    "plugin": ("compat_tests", "tests", "bench"),
}
"""Package -> the top-level packages above it, which none of its modules may import."""

KNOWN_EXCEPTIONS: dict[tuple[str, str], str] = {}
"""(file, imported module) pairs still pointing upward, each with the reason it is tolerated."""


DYNAMIC_IMPORTS = {"import_module", "__import__"}
"""Calls that import the module their first argument names, when that is a literal."""


def imported_modules(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Every absolute module an ``import``, ``from ... import`` or ``import_module("...")``
    names, with its line."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module
        elif isinstance(node, ast.Call) and node.args and _called(node.func) in DYNAMIC_IMPORTS:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                yield node.lineno, first.value


def _called(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    return func.attr if isinstance(func, ast.Attribute) else ""


def upward_imports(root: Path, forbidden: dict[str, tuple[str, ...]]) -> list[tuple[str, int, str]]:
    """(file relative to ``root``, line, module) of every import that points upward."""
    found = []
    for package, above in forbidden.items():
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=relative)
            for line, module in imported_modules(tree):
                if module.split(".", 1)[0] in above:
                    found.append((relative, line, module))
    return found


def test_no_import_points_upward() -> None:
    found = upward_imports(ROOT, FORBIDDEN)
    unexpected = [f"{path}:{line}: imports {module}" for path, line, module in found
                  if (path, module) not in KNOWN_EXCEPTIONS]
    assert not unexpected, "imports pointing up the layers:\n" + "\n".join(unexpected)


def test_every_known_exception_still_exists() -> None:
    """An exception that has been fixed leaves the list, so the check stays as strict as it can."""
    present = {(path, module) for path, _line, module in upward_imports(ROOT, FORBIDDEN)}
    stale = sorted(set(KNOWN_EXCEPTIONS) - present)
    assert not stale, f"fixed, remove from KNOWN_EXCEPTIONS: {stale}"


def test_every_layer_exists() -> None:
    for package in FORBIDDEN:
        assert (ROOT / package / "__init__.py").is_file(), package


@pytest.mark.parametrize(
    ("package", "source", "expected"),
    [
        ("api_versions", "from plugin.model import x\n", "api_versions/bad.py:1: plugin.model"),
        ("api_versions", "def f():\n    import plugin.process.metrics\n",
         "api_versions/bad.py:2: plugin.process.metrics"),
        ("api_versions", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
         "    from plugin.serving import cdi\n", "api_versions/bad.py:3: plugin.serving"),
        ("value_types", "import api_versions.wire\n", "value_types/bad.py:1: api_versions.wire"),
        ("plugin", "from compat_tests.demo import run\n", "plugin/bad.py:1: compat_tests.demo"),
        ("api_versions", "import importlib\nimportlib.import_module('plugin.model')\n",
         "api_versions/bad.py:2: plugin.model"),
    ],
)
def test_the_check_sees_every_kind_of_upward_import(
    tmp_path: Path, package: str, source: str, expected: str
) -> None:
    (tmp_path / package).mkdir()
    (tmp_path / package / "bad.py").write_text(source, encoding="utf-8")
    (tmp_path / package / "fine.py").write_text(
        "from . import bad\nimport logging\n", encoding="utf-8")
    found = [f"{path}:{line}: {module}" for path, line, module in
             upward_imports(tmp_path, FORBIDDEN)]
    assert found == [expected]
