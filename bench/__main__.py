"""``python -m bench``: run every benchmark module and print one table."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import bench
from bench.table import Row, render


def main(selected: list[str]) -> int:
    rows: list[Row] = []
    names = [m.name for m in pkgutil.iter_modules(bench.__path__) if m.name not in ("table",)]
    for name in sorted(names):
        if selected and name not in selected:
            continue
        module = importlib.import_module(f"bench.{name}")
        if hasattr(module, "run"):
            print(f"running bench.{name} ...", file=sys.stderr)
            rows.extend(module.run())
    print(render(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
