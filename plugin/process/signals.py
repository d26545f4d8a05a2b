"""What each signal means to ``serve``, and making sure none of them leaves a socket behind.

* SIGTERM, SIGINT, SIGQUIT: stop cleanly (sockets removed, exit 0). Stopping is idempotent:
  a second signal while stopping is logged and changes nothing, and once stopped every
  signal is ignored until the process is gone, so a kubelet or a script that signals twice
  never turns a clean exit into death by signal (exit 143).
* SIGHUP: rescan the node and register every resource anew, as the b<>com and NVIDIA
  plugins do; the process keeps running.
* SIGUSR1: rescan and log a status report (resources, generation, devices); nothing is
  re-registered, so capacity is not touched.
* Every other catchable signal whose default is to terminate (SIGUSR2, SIGALRM, SIGPWR,
  real-time signals...): logged and ignored. A stray ``kill -USR2`` must not take a node's
  accelerators away, and would otherwise kill the process with its socket left behind.

Handlers are plain ``signal.signal`` handlers that hand the signal to the event loop; the
loop's own ``add_signal_handler`` is not used because closing the loop restores the default
disposition, leaving a window in which a late SIGTERM kills the exiting process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Callable
from enum import Enum
from types import FrameType

log = logging.getLogger(__name__)


class Meaning(Enum):
    STOP = "stop"
    RELOAD = "reload"
    STATUS = "status"
    IGNORE = "ignore"


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)
_IGNORED_BY_NAME = ("SIGUSR2", "SIGALRM", "SIGVTALRM", "SIGPROF", "SIGIO", "SIGXCPU", "SIGPWR",
                    "SIGSTKFLT")


def meanings() -> dict[int, Meaning]:
    table: dict[int, Meaning] = {int(s): Meaning.STOP for s in STOP_SIGNALS}
    table[signal.SIGHUP] = Meaning.RELOAD
    table[signal.SIGUSR1] = Meaning.STATUS
    for name in _IGNORED_BY_NAME:
        if hasattr(signal, name):
            table.setdefault(int(getattr(signal, name)), Meaning.IGNORE)
    for number in range(signal.SIGRTMIN, signal.SIGRTMAX + 1):
        table.setdefault(number, Meaning.IGNORE)
    return table


def name_of(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        if signal.SIGRTMIN <= signum <= signal.SIGRTMAX:
            return f"SIGRTMIN+{signum - signal.SIGRTMIN}"
        return f"signal {signum}"


Handler = Callable[[int, Meaning], None]
_Disposition = Callable[[int, FrameType | None], object] | int | None


class SignalRouter:
    """Routes every signal in :func:`meanings` to ``handler`` on the event loop."""

    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        self._previous: dict[int, _Disposition] = {}

    def install(self, everything: bool = True) -> None:
        """Take over the signals (only possible in the main thread; elsewhere a no-op).

        ``everything=False`` takes only the stop signals, for a daemon run inside another
        program (tests, the demo) that keeps its own use of SIGALRM and the like.
        """
        if threading.current_thread() is not threading.main_thread():
            log.debug("not in the main thread; signal handling left to the caller")
            return
        loop = asyncio.get_running_loop()
        table = {s: m for s, m in meanings().items() if everything or m is Meaning.STOP}

        def deliver(signum: int, _frame: FrameType | None) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                loop.call_soon_threadsafe(self._handler, signum, table[signum])

        for signum in table:
            with contextlib.suppress(OSError, ValueError):
                self._previous[signum] = signal.signal(signum, deliver)

    def release(self, ignore: bool) -> None:
        """Hand the signals back; with ``ignore`` the process ignores them from now on.

        The switch from our handler to SIG_IGN is a single ``signal()`` call per signal, so
        there is no instant in which the default (terminate) disposition is in force.
        """
        for signum, previous in self._previous.items():
            replacement = signal.SIG_IGN if ignore else previous
            with contextlib.suppress(OSError, ValueError, TypeError):
                signal.signal(signum, replacement)
        self._previous.clear()
