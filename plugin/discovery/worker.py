"""One thread for blocking filesystem work, which a stuck call can neither multiply nor pin.

sysfs reads are blocking calls, and a read the kernel never answers cannot be interrupted or
killed from Python. ``asyncio.to_thread`` would put such a call on the loop's default
executor, whose threads ``asyncio.run`` joins on the way out: one wedged read and the plugin
no longer exits on SIGTERM. So the work runs here instead, on a single daemon thread that
nothing joins, one call at a time; the caller can see what is running and since when, and
decides itself not to queue more behind a call that does not return.

The same thread also runs one periodic call of its own, whenever it has been idle for a
while (the monitor's health re-read). A periodic call driven from the event loop would wake
three threads per tick (the loop's timer, this thread, the loop again for the result); run
here it wakes this thread alone, and the loop only hears of it when there is news.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)


class Job:
    """A call the worker thread is running: what it is, since when, on which thread.

    A plain slotted class rather than a frozen dataclass: one is made on every health
    re-read, twice a second for the life of the node, and a frozen dataclass costs several
    times more to construct.
    """

    __slots__ = ("started", "thread_id", "what")

    def __init__(self, what: str, thread_id: int = 0) -> None:
        self.what = what
        self.started = time.monotonic()
        self.thread_id = thread_id

    def age(self) -> float:
        return time.monotonic() - self.started


_Item = tuple[str, Callable[[], Any], asyncio.Future[Any], asyncio.AbstractEventLoop]


@dataclass(frozen=True)
class Periodic:
    """A call the worker makes itself after ``interval`` seconds without other work."""

    what: str
    interval: float
    call: Callable[[], None]
    wanted: Callable[[], bool] = lambda: True
    """Asked before each wait; while False the thread just waits for queued calls. It may
    change only through a queued call, which is what makes the thread ask again."""


class BlockingWorker:
    """Runs blocking calls one after the other on a daemon thread started on first use.

    The thread sleeps in ``poll`` on an eventfd that :meth:`run` rings, not on a queue's
    lock: with a timeout, the lock wait costs a third more per wake-up than ``poll`` on this
    kind of virtual machine, and an idle worker is nothing but wake-ups.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._items: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._doorbell = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self.current: Job | None = None
        """The call running now, None when the thread waits for work."""
        self._periodic: Periodic | None = None

    async def run(self, what: str, call: Callable[[], T]) -> T:
        """Run ``call`` on the worker thread and return its result or raise its exception.

        Cancelling the caller abandons the result; the call itself runs to its end, since a
        blocked system call cannot be interrupted.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._ensure_thread()
        self._put((what, call, future, loop))
        return await future

    def every(self, periodic: Periodic | None) -> None:
        """Make ``periodic`` this thread's own idle-time call (None: no such call).

        It runs between queued calls, never beside one, so it needs no lock against them;
        its clock restarts after every call, queued or periodic. It must not raise: if it
        does, the error is logged and it runs again one interval later.
        """
        self._periodic = periodic
        self._ensure_thread()
        self._put(_NUDGE)  # wake the thread so it picks up the new interval

    def _put(self, item: _Item) -> None:
        self._items.put(item)
        os.eventfd_write(self._doorbell, 1)

    def _ensure_thread(self) -> None:
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
                self._thread.start()

    def _wait(self, poller: select.poll) -> bool:
        """Sleep until a call is queued (True) or the periodic call is due (False)."""
        periodic = self._periodic
        timeout = None if periodic is None or not periodic.wanted() else periodic.interval * 1e3
        if not poller.poll(timeout):
            return False
        with contextlib.suppress(BlockingIOError):  # rung again and already drained
            os.eventfd_read(self._doorbell)
        return True

    def _run_periodic(self) -> None:
        periodic = self._periodic
        if periodic is None:
            return
        self.current = Job(periodic.what, thread_id=threading.get_ident())
        try:
            periodic.call()
        except Exception:
            log.exception("%s failed; trying again in %g s", periodic.what, periodic.interval)
        finally:
            self.current = None

    def _serve(self) -> None:
        _name_native_thread(self.name)
        poller = select.poll()
        poller.register(self._doorbell, select.POLLIN)
        while True:
            if not self._wait(poller):
                self._run_periodic()
                continue
            while True:
                try:
                    item = self._items.get_nowait()
                except queue.Empty:
                    break
                self._run_queued(item)

    def _run_queued(self, item: _Item) -> None:
        what, call, future, loop = item
        if future is None or future.cancelled():
            return  # a nudge, or a call whose caller gave up
        self.current = Job(what, thread_id=threading.get_ident())
        try:
            result, error = call(), None
        except Exception as exc:  # handed to the awaiting caller, not lost here
            result, error = None, exc
        except BaseException as exc:  # SystemExit and the like: the caller must not hang
            result, error = None, RuntimeError(f"{what} ended with {exc!r}")
        finally:
            self.current = None
        with contextlib.suppress(RuntimeError):  # the loop closed while we were blocked
            loop.call_soon_threadsafe(_settle, future, result, error)


def _name_native_thread(name: str) -> None:
    """Give the OS thread the worker's name, which ``top -H``, ``ps -L`` and per-thread CPU
    accounting show; Python 3.11 leaves every thread named after the interpreter."""
    with contextlib.suppress(OSError):
        Path("/proc/thread-self/comm").write_text(name[:15])


_NUDGE: Any = ("", None, None, None)
"""Queued by :meth:`BlockingWorker.every` only to wake the thread."""


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
