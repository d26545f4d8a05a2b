"""No test asserts that something took less than a number of seconds.

On a shared 2-core machine under load a wall-clock bound fails without any fault (three such
tests failed in one loaded run), so a speed is measured in ``bench/`` and printed as a table,
never asserted by a test. A test asserts what a bound stood for instead: the event happens at
all (its waiting helper's generous limit is a guard against hangs, not a target), the
product's own timeout fires and says so, a call count. This check reads every module of
``tests/`` and ``compat_tests/`` with ``ast`` and names each ``assert`` that compares a
duration with ``<``/``<=`` (or ``>``/``>=`` the other way round) against a bound below the
suite's per-test timeout, so such an assertion cannot come back unnoticed.

A duration is: a clock read minus something (``time.monotonic() - started``, ``loop.time()
- t``), a name saying so (``elapsed``, ``took``, ``duration``, ``seconds``, ``latency``...),
a name assigned from either in the same function or from an ``await``-ed ``until`` helper
(which returns the seconds it waited), and ``max``/``min``/an index of those. A bound is
what the module itself says it is: a number, arithmetic of numbers, a module-level constant
(also one imported from a sibling module), a parameter's default; a bound this check cannot
work out is reported too, since comparing a duration against anything is the pattern.
Lower bounds (``elapsed >= pause``: a wait that did happen) only get longer under load and
are not reported.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("tests", "compat_tests")
PER_TEST_TIMEOUT = 120.0
"""pyproject's ``timeout``: a bound at or above it is no tighter than the suite itself."""
DURATION_WORDS = re.compile(r"(^|_)(elapsed|took|duration|durations|seconds|secs|latency|"
                            r"latencies|waited|spent|handover)($|_)")
CLOCKS = {"monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns", "time"}
"""``time.monotonic()``, ``time.time()``, ``loop.time()``...: a call of one is a clock read."""
UNKNOWN = float("-inf")
"""A bound that could not be worked out: reported, as being below any limit."""


def _called(node: ast.AST) -> str:
    """The last name of what a call calls (``time.monotonic`` -> ``monotonic``), else ''."""
    if isinstance(node, ast.Call):
        func = node.func
        return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return ""


def _name(node: ast.AST) -> str:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


class _Module:
    """One module's constants and functions, as far as this check needs them."""

    def __init__(self, path: Path, tree: ast.Module, root: Path) -> None:
        self.path, self.root = path, root
        self.constants: dict[str, ast.expr] = {}
        self.imported: dict[str, Path] = {}
        for node in tree.body:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        self.constants[target.id] = node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                    and node.value is not None:
                self.constants[node.target.id] = node.value
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                source = root / (node.module.replace(".", "/") + ".py")
                for alias in node.names:
                    self.imported[alias.asname or alias.name] = source

    def bound(self, node: ast.AST, defaults: dict[str, ast.expr], seen: int = 0) -> float:
        """The number ``node`` stands for; UNKNOWN when it cannot be worked out."""
        if seen > 8:
            return UNKNOWN
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float) \
                and not isinstance(node.value, bool):
            return float(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -self.bound(node.operand, defaults, seen + 1)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub | ast.Mult):
            left = self.bound(node.left, defaults, seen + 1)
            right = self.bound(node.right, defaults, seen + 1)
            if UNKNOWN in (left, right):
                return UNKNOWN
            return {ast.Add: left + right, ast.Sub: left - right,
                    ast.Mult: left * right}[type(node.op)]
        if isinstance(node, ast.Name):
            if node.id in defaults:
                return self.bound(defaults[node.id], {}, seen + 1)
            if node.id in self.constants:
                return self.bound(self.constants[node.id], {}, seen + 1)
            source = self.imported.get(node.id)
            if source is not None and source.exists():
                other = _Module(source, ast.parse(source.read_text()), self.root)
                return other.bound(node, {}, seen + 1)
        return UNKNOWN


def _defaults(function: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, ast.expr]:
    args = function.args
    positional = [*args.posonlyargs, *args.args]
    found = {a.arg: d for a, d in zip(positional[len(positional) - len(args.defaults):],
                                      args.defaults, strict=True)}
    found.update({a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
                  if d is not None})
    return found


def _is_clock(node: ast.AST, stamps: set[str]) -> bool:
    """A clock read, or a name holding one: a point in time, not yet a duration."""
    if isinstance(node, ast.Call):
        return _called(node) in CLOCKS and not node.args
    return isinstance(node, ast.Name) and node.id in stamps


def _is_duration(node: ast.AST, timed: set[str], stamps: set[str]) -> bool:
    if isinstance(node, ast.Await):
        return _is_duration(node.value, timed, stamps)
    if isinstance(node, ast.Call):
        called = _called(node)
        if called in ("max", "min", "sum", "median", "percentile"):
            return any(_is_duration(a, timed, stamps) for a in node.args)
        return called == "until" or called.endswith("_until") or called.startswith("until_") \
            or called.startswith("time_")
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub):
        return _is_clock(node.left, stamps) or _is_duration(node.left, timed, stamps)
    if isinstance(node, ast.Subscript):
        return _is_duration(node.value, timed, stamps)
    if isinstance(node, ast.Name | ast.Attribute):
        name = _name(node)
        return name in timed or bool(DURATION_WORDS.search(name))
    return False


def _own(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a function (or a module), not those of the functions defined in it."""
    pending = list(ast.iter_child_nodes(scope))
    while pending:
        node = pending.pop()
        yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            pending.extend(ast.iter_child_nodes(node))


def _timed_names(scope: ast.AST) -> tuple[set[str], set[str]]:
    """Names a scope assigns a duration to, and those it assigns a clock read to (twice
    over: a duration may be made of another)."""
    timed: set[str] = set()
    stamps: set[str] = set()
    for _ in range(2):
        for node in _own(scope):
            if not isinstance(node, ast.Assign):
                continue
            names = {t.id for t in node.targets if isinstance(t, ast.Name)}
            if _is_clock(node.value, stamps):
                stamps.update(names)
            elif _is_duration(node.value, timed, stamps):
                timed.update(names)
    return timed, stamps


def _upper_bounds(test: ast.expr) -> Iterator[tuple[ast.expr, ast.expr]]:
    """(duration side, bound side) of each ``<``/``<=`` in an assert's expression."""
    for node in ast.walk(test):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for index, op in enumerate(node.ops):
            left, right = operands[index], operands[index + 1]
            if isinstance(op, ast.Lt | ast.LtE):
                yield left, right
            elif isinstance(op, ast.Gt | ast.GtE):
                yield right, left


def timed_asserts(path: Path, source: str, root: Path = ROOT) -> list[str]:
    """``file:line`` of each assert in ``source`` bounding a duration below the timeout."""
    tree = ast.parse(source)
    module = _Module(path, tree, root)
    found = []
    scopes: list[tuple[ast.AST, dict[str, ast.expr]]] = [(tree, {})]
    scopes += [(f, _defaults(f)) for f in ast.walk(tree)
               if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)]
    for scope, defaults in scopes:
        timed, stamps = _timed_names(scope)
        for node in _own(scope):
            if not isinstance(node, ast.Assert):
                continue
            for duration, bound in _upper_bounds(node.test):
                if _is_duration(duration, timed, stamps) and \
                        module.bound(bound, defaults) < PER_TEST_TIMEOUT:
                    found.append(f"{path.relative_to(root)}:{node.lineno}")
    return sorted(set(found), key=lambda where: int(where.rsplit(":", 1)[1]))


def scan(root: Path = ROOT) -> list[str]:
    found = []
    for package in SCANNED:
        for path in sorted((root / package).rglob("*.py")):
            found += timed_asserts(path, path.read_text(), root)
    return found


# -- the check's own cases ------------------------------------------------------------------


SAMPLES = Path(__file__).parent / "timed_assert_samples"
"""Sources of the check's own cases, kept in text files: they are samples of the defect (and
of what is not one), not assertions of this suite."""


def samples(name: str) -> list[str]:
    """The blocks of ``name``: sources separated by lines of dashes, the header dropped."""
    blocks = (SAMPLES / name).read_text().split("# ----\n")[1:]
    return [block for block in blocks if block.strip()]


@pytest.mark.parametrize("source", samples("named.txt"))
def test_a_duration_bounded_below_the_timeout_is_named(tmp_path: Path, source: str) -> None:
    path = tmp_path / "tests" / "test_x.py"
    assert [w.split(":")[0] for w in timed_asserts(path, source, tmp_path)] == \
        ["tests/test_x.py"]


@pytest.mark.parametrize("source", samples("not_named.txt"))
def test_counts_lower_bounds_and_generous_limits_are_not(tmp_path: Path, source: str) -> None:
    assert timed_asserts(tmp_path / "test_x.py", source, tmp_path) == []


def test_a_bound_imported_from_a_sibling_module_is_read_there(tmp_path: Path) -> None:
    (tmp_path / "compat_tests").mkdir()
    (tmp_path / "compat_tests" / "limits.py").write_text("QUICK = 2.0\nSLOW = 300.0\n")
    source = (SAMPLES / "imported_bound.txt").read_text()
    path = tmp_path / "compat_tests" / "test_x.py"
    assert timed_asserts(path, source, tmp_path) == ["compat_tests/test_x.py:3"]


def test_no_test_asserts_a_duration() -> None:
    assert scan() == [], "measure speed in bench/; assert what the bound stood for"
