"""No module of the product or its compatibility suite over 450 lines.

A module that long has stopped having one job; the fix is a split by concern, never a
raised limit. Generated code (``api_versions/_generated``) is not written by hand and is
not counted.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LIMIT = 450
PACKAGES = ("plugin", "api_versions", "compat_tests")
GENERATED = REPO / "api_versions" / "_generated"


def too_long(root: Path = REPO) -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if path.is_relative_to(root / GENERATED.relative_to(REPO)):
                continue
            lines = len(path.read_text().splitlines())
            if lines > LIMIT:
                found.append(f"{path.relative_to(root)}: {lines} lines")
    return found


def test_the_check_names_a_long_module_and_skips_generated_code(tmp_path: Path) -> None:
    (tmp_path / "plugin").mkdir()
    (tmp_path / "plugin" / "long.py").write_text("x = 1\n" * (LIMIT + 1))
    (tmp_path / "plugin" / "fine.py").write_text("x = 1\n" * LIMIT)
    (tmp_path / "api_versions" / "_generated").mkdir(parents=True)
    (tmp_path / "api_versions" / "_generated" / "big_pb2.py").write_text("x = 1\n" * 9999)
    assert too_long(tmp_path) == [f"plugin/long.py: {LIMIT + 1} lines"]


def test_no_module_is_over_450_lines() -> None:
    assert too_long() == [], "split these by concern"
