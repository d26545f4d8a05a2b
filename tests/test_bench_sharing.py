"""``python -m bench sharing`` runs: a tiny run against the real ``serve`` processes.

Figures are never checked (timing targets live in the printed table, not in tests): what is
checked is that the benchmark still drives what it claims to, every share answered with its
own share ID on a port published shared, and prints every row of its table.
"""

from __future__ import annotations

import pkgutil
import re

import bench
from bench import sharing
from bench.table import render

MS = r"\d+\.\d\d ms"


def test_python_m_bench_runs_the_sharing_benchmark() -> None:
    names = [m.name for m in pkgutil.iter_modules(bench.__path__)]
    assert "sharing" in names
    assert callable(sharing.run)


def test_a_tiny_run_prints_every_row() -> None:
    rows = sharing.run(rounds=2, warm_up=0)
    values = {row.metric: row.value for row in rows}
    for metric in ("DRA prepare, first share of a port, none on the node, p50 / p90",
                   "DRA prepare, first share of a port, another port's share held, p50 / p90",
                   "DRA prepare, later shares, p50 / p90",
                   "DRA prepare, whole claim, sharing on, p50 / p90",
                   "DRA prepare, whole claim, sharing off, p50 / p90"):
        assert re.fullmatch(f"{MS} / {MS}", values[metric]), (metric, values[metric])
    ratios = [row for row in rows if row.target]
    assert [row.metric for row in ratios] == [
        "DRA prepare, later share / whole claim, sharing on (p50)",
        "DRA prepare, first share of a port / whole claim (p50)",
        "DRA prepare, first share on the node / whole claim (p50)",
        "DRA prepare, whole claim, sharing on / off (p50)"]
    for row in ratios:
        assert re.fullmatch(r"\d+\.\d{3}x", row.value), row
        assert row.target == "<= 1.05x"
        assert row.note.startswith(("met;", "NOT met;")), row
    [unprepare] = [row.value for row in rows if row.metric.startswith("DRA unprepare p50")]
    assert re.fullmatch(" / ".join([MS] * 5), unprepare), unprepare
    table = render(rows)
    assert all(row.metric in table for row in rows)
