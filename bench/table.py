"""One table format for every benchmark, so figures can be pasted into docs/performance.md
as they are."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    metric: str
    value: str
    target: str = ""
    note: str = ""


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sample."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def p50_p99(values: Sequence[float]) -> str:
    """``<median> / <99th percentile>`` in ms, as the latency rows show them."""
    return f"{ms(median(values))} / {ms(percentile(values, 99))}"


def render(rows: Iterable[Row]) -> str:
    rows = list(rows)
    header = Row("metric", "value", "target", "note")
    table = [header, *rows]
    widths = [max(len(getattr(r, f)) for r in table) for f in ("metric", "value", "target", "note")]

    def line(r: Row) -> str:
        cells = (r.metric, r.value, r.target, r.note)
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), sep, *(line(r) for r in rows)])
