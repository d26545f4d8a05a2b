"""The discovery worker thread: queued calls, its own idle-time call, and its name."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from plugin.discovery.worker import BlockingWorker, Periodic


async def test_queued_calls_run_in_order_and_hand_back_results_and_errors() -> None:
    worker = BlockingWorker("test-worker")
    order: list[int] = []

    def step(n: int) -> int:
        order.append(n)
        return n * n

    def fail() -> None:
        raise ValueError("bad sysfs")

    # Queued faster than the thread drains them: one doorbell ring may stand for several.
    results = await asyncio.gather(*(worker.run(f"call {n}", lambda n=n: step(n))
                                     for n in range(50)))
    assert results == [n * n for n in range(50)]
    assert order == list(range(50))
    with pytest.raises(ValueError, match="bad sysfs"):
        await worker.run("failing call", fail)
    assert await worker.run("after a failure", lambda: "still serving") == "still serving"


async def test_a_call_whose_caller_gave_up_before_it_started_is_skipped() -> None:
    worker = BlockingWorker("test-worker")
    release = threading.Event()
    ran: list[str] = []
    blocker = asyncio.ensure_future(worker.run("blocker", release.wait))
    await asyncio.sleep(0.05)
    abandoned = asyncio.ensure_future(worker.run("abandoned", lambda: ran.append("abandoned")))
    await asyncio.sleep(0.05)
    abandoned.cancel()
    release.set()
    await blocker
    await worker.run("next", lambda: ran.append("next"))
    assert ran == ["next"]


async def test_the_idle_time_call_runs_only_while_wanted_and_stops_when_removed() -> None:
    worker = BlockingWorker("test-worker")
    ticks: list[float] = []
    wanted = True
    worker.every(Periodic("tick", 0.02, lambda: ticks.append(time.monotonic()),
                          wanted=lambda: wanted))
    deadline = time.monotonic() + 10
    while len(ticks) < 5 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert len(ticks) >= 5

    # "wanted" may change only through a queued call, which makes the thread ask again.
    def unwant() -> None:
        nonlocal wanted
        wanted = False

    await worker.run("stop wanting", unwant)
    paused_at = len(ticks)
    await asyncio.sleep(0.2)
    assert len(ticks) == paused_at

    worker.every(None)
    await asyncio.sleep(0.2)
    assert len(ticks) == paused_at


async def test_an_idle_time_call_that_raises_is_logged_and_runs_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    worker = BlockingWorker("test-worker")
    calls = 0

    def flaky() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OSError("device went away")

    worker.every(Periodic("flaky re-read", 0.02, flaky))
    deadline = time.monotonic() + 10
    while calls < 3 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    worker.every(None)
    assert calls >= 3
    assert any("flaky re-read failed" in r.getMessage() for r in caplog.records)


async def test_the_os_thread_carries_the_worker_name() -> None:
    """So ``top -H`` and per-thread accounting say which thread is discovery."""
    worker = BlockingWorker("intel-discovery")
    native = await worker.run("who am I", threading.get_native_id)
    assert Path(f"/proc/self/task/{native}/comm").read_text().strip() == "intel-discovery"
