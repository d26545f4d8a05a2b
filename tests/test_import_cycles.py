"""No import circles: a module can be read, tested and changed from the ones it imports.

The graph is built from the source with ``ast``, every import counted wherever it sits (a
function's body, an ``if TYPE_CHECKING:`` block): an import deferred to dodge a circle is
still a circle in the design. A ``from package import name`` counts as importing the
package and, where ``name`` is a module, that module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(path: Path, name: str) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                kept = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*kept, base] if base else kept)
            found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return found


def import_graph(top: str) -> dict[str, set[str]]:
    """Module -> the modules under ``top`` it imports."""
    paths = {_module_name(p): p for p in (REPO / top.replace(".", "/")).rglob("*.py")}
    return {name: (_imported(path, name) & paths.keys()) - {name}
            for name, path in paths.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(graph[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while not component or component[-1] != module:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_the_check_finds_a_circle_through_deferred_imports(tmp_path: Path) -> None:
    module = tmp_path / "socket.py"
    module.write_text("from typing import TYPE_CHECKING\n"
                      "if TYPE_CHECKING:\n    from .server import Timing\n"
                      "def f():\n    from . import channels\n")
    found = _imported(module, "pkg.socket")
    assert {"pkg.server", "pkg.channels"} <= found
    graph = {"pkg.server": {"pkg.socket"}, "pkg.socket": found & {"pkg.server", "pkg.channels"},
             "pkg.channels": set()}
    assert cycles(graph) == [["pkg.server", "pkg.socket"]]


@pytest.mark.parametrize("top", ["plugin.serving.deviceplugin", "plugin"])
def test_no_import_circle(top: str) -> None:
    graph = import_graph(top)
    assert graph, top
    assert cycles(graph) == [], f"modules of {top} that import each other in a circle"
