"""One thread for blocking filesystem work, which a stuck call can neither multiply nor pin.

sysfs reads are blocking calls, and a read the kernel never answers cannot be interrupted or
killed from Python. ``asyncio.to_thread`` would put such a call on the loop's default
executor, whose threads ``asyncio.run`` joins on the way out: one wedged read and the plugin
no longer exits on SIGTERM. So the work runs here instead, on a single daemon thread that
nothing joins, one call at a time; the caller can see what is running and since when, and
decides itself not to queue more behind a call that does not return.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Job:
    """A call the worker thread is running: what it is, since when, on which thread."""

    what: str
    started: float = field(default_factory=time.monotonic)
    thread_id: int = 0

    def age(self) -> float:
        return time.monotonic() - self.started


_Item = tuple[str, Callable[[], Any], asyncio.Future[Any], asyncio.AbstractEventLoop]


class BlockingWorker:
    """Runs blocking calls one after the other on a daemon thread started on first use."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._items: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self.current: Job | None = None
        """The call running now, None when the thread waits for work."""

    async def run(self, what: str, call: Callable[[], T]) -> T:
        """Run ``call`` on the worker thread and return its result or raise its exception.

        Cancelling the caller abandons the result; the call itself runs to its end, since a
        blocked system call cannot be interrupted.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._ensure_thread()
        self._items.put((what, call, future, loop))
        return await future

    def _ensure_thread(self) -> None:
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
                self._thread.start()

    def _serve(self) -> None:
        while True:
            what, call, future, loop = self._items.get()
            if future.cancelled():
                continue
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


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
