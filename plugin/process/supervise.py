"""Long-running tasks that must not end quietly.

The daemon lives on a handful of loops (device monitor, kubelet-directory watcher, safety
net, heartbeat, one server per resource). A loop that raised, or returned when it should
run forever, used to leave its task done with nobody looking: the plugin kept running
without, say, its directory watcher, and reacted to kubelet restarts seconds late. Every
such loop runs under :func:`supervise`, which says so in the log and starts it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable

log = logging.getLogger(__name__)

INITIAL_DELAY = 0.1
MAX_DELAY = 30.0
STEADY_AFTER = 60.0
"""A loop that ran this long before failing is restarted after the initial delay again."""


async def supervise(
    name: str,
    body: Callable[[], Awaitable[object]],
    *,
    finished: Callable[[], bool] = lambda: False,
    max_delay: float = MAX_DELAY,
) -> None:
    """Run ``body`` until it ends with ``finished()`` true; restart it with back-off otherwise.

    Cancellation is passed through (that is how the daemon stops its loops). Failures are
    logged as errors: an OS error in one line (a directory that cannot be watched is a state
    of the node, not a bug), anything else with its traceback.
    """
    loop = asyncio.get_running_loop()
    delay = INITIAL_DELAY
    while True:
        started = loop.time()
        try:
            await body()
        except asyncio.CancelledError:
            raise
        except OSError as exc:
            if finished():
                return
            log.error("%s failed: %s; restarting it in %.1fs", name, exc, delay)
        except Exception:
            if finished():
                return
            log.exception("%s failed; restarting it in %.1fs", name, delay)
        else:
            if finished():
                return
            log.error("%s ended unexpectedly; restarting it in %.1fs", name, delay)
        if loop.time() - started >= STEADY_AFTER:
            delay = INITIAL_DELAY
        await asyncio.sleep(delay)
        delay = min(delay * 2, max_delay)


async def cancel_all(tasks: Iterable[asyncio.Task[object] | None]) -> None:
    """Cancel ``tasks`` (None: no task) and wait until each has ended: what stopping a set of
    per-claim workers takes, so none outlives the object that started it."""
    started = [task for task in tasks if task is not None]
    for task in started:
        task.cancel()
    for task in started:
        with contextlib.suppress(asyncio.CancelledError):
            await task
