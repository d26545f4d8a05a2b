"""Slow loops sleeping to shared ticks wake the process together."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plugin.process.ticks import next_tick, sleep_to_tick


@pytest.mark.parametrize(("now", "period", "tick"), [
    (0.0, 5.0, 5.0),
    (4.2, 5.0, 5.0),
    (5.0, 5.0, 10.0),
    (4.9995, 5.0, 10.0),  # woken a hair before the tick: that tick counts as reached
    (12.3, 2.5, 12.5),
    (1000.01, 30.0, 1020.0),
])
def test_the_next_tick_is_the_next_multiple_of_the_period(now: float, period: float,
                                                            tick: float) -> None:
    assert next_tick(now, period) == pytest.approx(tick)


@given(now=st.floats(min_value=0, max_value=1e7, allow_nan=False),
       periods=st.sampled_from([(0.5, 5.0), (2.5, 5.0), (5.0, 10.0), (5.0, 30.0)]))
def test_a_tick_of_the_longer_period_is_exactly_a_tick_of_the_shorter(
        now: float, periods: tuple[float, float]) -> None:
    """Exactly equal deadlines are what asyncio runs in one turn, after one wake-up."""
    short, long = periods
    if next_tick(now, short) == pytest.approx(next_tick(now, long), abs=1e-6):
        assert next_tick(now, short) == next_tick(now, long)


async def test_a_cancelled_sleep_leaves_no_timer_behind() -> None:
    loop = asyncio.get_running_loop()
    before = len(loop._scheduled)  # type: ignore[attr-defined]
    task = asyncio.create_task(sleep_to_tick(60.0))
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await asyncio.sleep(0)
    assert len([h for h in loop._scheduled if not h.cancelled()]) <= before  # type: ignore[attr-defined]
