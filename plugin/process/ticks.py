"""Periodic wake-ups that fall on shared moments, so an idle plugin is woken as seldom as it can be.

An idle plugin costs the node almost nothing but its wake-ups: on a virtual machine each
timer that fires costs a thread about a tenth of a millisecond before it does any work. The
daemon's slow loops (kubelet safety net, stall watchdog, safety-net rescan, heartbeat) used
to sleep their own period from their own start, so each woke the process at its own moment.
Sleeping instead to the next multiple of the period on the event loop's clock makes every
loop whose period divides another's fire in the same turn of the loop: a 5 s and a 30 s loop
wake the process six times in 30 s, not seven, and never a few milliseconds apart.
"""

from __future__ import annotations

import asyncio
import math

EARLY_SECONDS = 1e-3
"""A loop woken this close before a tick (asyncio may fire a timer a hair early) waits for
the following one, rather than running twice for one tick."""


def next_tick(now: float, period: float) -> float:
    """The first multiple of ``period`` that is later than ``now`` (plus EARLY_SECONDS)."""
    return (math.floor((now + EARLY_SECONDS) / period) + 1) * period


def tick_deadline(period: float) -> float:
    """The running loop's time of the next tick of ``period``, for ``asyncio.timeout_at``."""
    return next_tick(asyncio.get_running_loop().time(), period)


async def sleep_to_tick(period: float) -> None:
    """Sleep until the next multiple of ``period`` on the running loop's clock.

    The deadline is handed to the loop as is (``call_at``), not turned back into a delay,
    so loops sleeping to the same tick share one timer deadline exactly.
    """
    loop = asyncio.get_running_loop()
    woken: asyncio.Future[None] = loop.create_future()
    timer = loop.call_at(next_tick(loop.time(), period), _wake, woken)
    try:
        await woken
    finally:
        timer.cancel()


def _wake(woken: asyncio.Future[None]) -> None:
    if not woken.done():
        woken.set_result(None)
