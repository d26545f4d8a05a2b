"""Building the package the way `make` and users do, and what the wheel ships.

The wheel is what a node runs: ``plugin``, ``api_versions`` and ``value_types``, nothing else.
The demo, the emulators and the fake sysfs trees live in ``compat_tests/`` and stay in the
source tree; the ``demo`` extra brings the third-party packages they import beyond the runtime's.
"""

from __future__ import annotations

import ast
import contextlib
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from email.parser import Parser
from importlib.metadata import PackageNotFoundError, packages_distributions, requires
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent
SHIPPED = {"plugin", "api_versions", "value_types"}
SOURCE_TREE_ONLY = "compat_tests"
NEWER_STDLIB = {"_sha2"}
"""Standard-library modules of Pythons newer than the one running the tests, imported only
there (plugin/model/sha256.py: CPython 3.12's SHA-2 extension, ``_sha256`` before it)."""


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, str]:
    """The wheel as `pip install .` builds it (with build isolation), and pip's output.

    Built in a tree that once built a release which shipped the demo: setuptools' build/lib
    still holds it, and must not pack it again."""
    out = tmp_path_factory.mktemp("wheel")
    for stale in ("plugin/cli/demo.py", "compat_tests/__init__.py"):
        left = REPO / "build" / "lib" / stale
        left.parent.mkdir(parents=True, exist_ok=True)
        left.write_text('"""Left by an earlier build."""\n')
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(out), str(REPO)],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = out.glob("k8s_accelerator_devplugin-*.whl")
    return wheel, done.stdout + done.stderr


def _names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def _metadata(wheel: Path) -> dict[str, list[str]]:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        message = Parser().parsestr(archive.read(name).decode())
    return {key: message.get_all(key) or [] for key in set(message.keys())}


def test_building_the_package_prints_no_deprecation_warning(built) -> None:
    # With build isolation, as `pip install .` and `pip install -e .` build: setuptools once
    # printed a "license as a TOML table is deprecated" box three times per build.
    _, output = built
    assert "deprecated" not in output.lower(), output[-3000:]


def test_wheel_ships_only_the_runtime_packages(built) -> None:
    wheel, _ = built
    names = _names(wheel)
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == SHIPPED
    assert not [n for n in names if n.startswith(SOURCE_TREE_ONLY)]
    stems = {Path(n).stem for n in names if n.endswith(".py")}
    assert not {s for s in stems if s.startswith(("fake_", "demo"))}, stems
    assert "plugin/cli/main.py" in names and "api_versions/wire.py" in names
    assert "value_types/devices.py" in names


def test_every_package_of_the_shipped_trees_is_in_the_wheel(built) -> None:
    """A package left out of the wheel imports from the checkout, so only an installed run
    would notice: the release whose `loader` could not find ``plugin.programming.remote``."""
    wheel, _ = built
    names = set(_names(wheel))
    packages = {init.parent.relative_to(REPO).as_posix()
                for top in SHIPPED for init in (REPO / top).rglob("__init__.py")}
    assert "api_versions/_generated" in packages  # written by the build, before packing
    missing = sorted(p for p in packages if f"{p}/__init__.py" not in names)
    assert not missing, f"packages not in the wheel: {missing}"
    modules = {p.relative_to(REPO).as_posix() for top in SHIPPED
               for p in (REPO / top).rglob("*.py") if p.parent.as_posix() in
               {(REPO / q).as_posix() for q in packages}}
    assert not sorted(modules - names), sorted(modules - names)


def test_wheel_carries_the_license_text_and_the_version(built) -> None:
    wheel, _ = built
    (license_file,) = [n for n in _names(wheel) if n.endswith("/licenses/LICENSE")]
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read(license_file) == (REPO / "LICENSE").read_bytes()
    metadata = _metadata(wheel)
    assert metadata["License-Expression"] == ["Apache-2.0"]
    assert metadata["License-File"] == ["LICENSE"]
    with (REPO / "pyproject.toml").open("rb") as file:
        assert metadata["Version"] == [tomllib.load(file)["project"]["version"]]


def test_demo_dependencies_are_an_extra_not_a_runtime_requirement(built) -> None:
    wheel, _ = built
    metadata = _metadata(wheel)
    assert "demo" in metadata["Provides-Extra"]
    runtime = {canonicalize_name(Requirement(r).name) for r in metadata["Requires-Dist"]
               if Requirement(r).marker is None}
    for demo_only in ("aiohttp", "cryptography", "multidict"):
        assert demo_only not in runtime


# --- what the code imports, against what an install brings --------------------------------


def _module_file(name: str) -> Path | None:
    path = REPO.joinpath(*name.split("."))
    for candidate in (path / "__init__.py", path.with_suffix(".py")):
        if candidate.exists():
            return candidate
    return None


def _imported_names(tree: ast.AST) -> Iterator[tuple[ast.AST, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node, node.module
            yield from ((node, f"{node.module}.{alias.name}") for alias in node.names)


def _third_party_imports(entry: str, follow: set[str]) -> set[str]:
    """Top-level names of the non-stdlib modules that ``entry`` imports, directly or through
    the modules of the packages in ``follow`` it imports."""
    seen: set[str] = set()
    third_party: set[str] = set()
    pending = [entry]
    while pending:
        name = pending.pop()
        path = _module_file(name)
        if name in seen or path is None:
            continue
        seen.add(name)
        for _, imported in _imported_names(ast.parse(path.read_text())):
            top = imported.split(".")[0]
            if top in follow:
                pending.append(imported)
            elif top not in (sys.stdlib_module_names | NEWER_STDLIB | SHIPPED
                             | {SOURCE_TREE_ONLY, "__future__"}):
                third_party.add(top)
    return third_party


def _installed_by(wheel: Path, *extras: str) -> set[str]:
    """Distributions `pip install '.[extras]'` brings: the closure of the wheel's requirements
    (their own requirements as installed here), by name."""
    pending = [Requirement(r) for r in _metadata(wheel)["Requires-Dist"]]
    wanted: set[str] = set()
    while pending:
        requirement = pending.pop()
        if requirement.marker and not any(
            requirement.marker.evaluate({"extra": extra}) for extra in ("", *extras)
        ):
            continue
        name = canonicalize_name(requirement.name)
        if name in wanted or name == "k8s-accelerator-devplugin":
            continue
        wanted.add(name)
        with contextlib.suppress(PackageNotFoundError):  # required where not installed
            pending += [Requirement(r) for r in requires(name) or []]
    return wanted


@pytest.mark.parametrize(("entry", "follow", "extras"), [
    ("plugin.cli.main", SHIPPED, ()),
    ("compat_tests.demo", SHIPPED | {SOURCE_TREE_ONLY}, ("demo",)),
    ("compat_tests.demo_migrate", SHIPPED | {SOURCE_TREE_ONLY}, ("demo",)),
    ("compat_tests.demo_program", SHIPPED | {SOURCE_TREE_ONLY}, ("demo",)),
    ("compat_tests.demo_share", SHIPPED | {SOURCE_TREE_ONLY}, ("demo",)),
])
def test_an_install_brings_every_package_the_code_imports(built, entry, follow, extras) -> None:
    available = _installed_by(built[0], *extras)
    missing = {
        module for module in _third_party_imports(entry, follow)
        if not {canonicalize_name(d) for d in packages_distributions().get(module, [])}
        & available
    }
    assert not missing, f"pip install '.[{','.join(extras)}]' brings nothing for {missing}"
