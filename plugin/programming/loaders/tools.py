"""Running a vendor tool (``fpgaconf``, ``xbutil``, the AWS FPGA SDK's tools): one way for all.

A tool is the operator's choice of path (a ``serve`` flag), so everything about it is
checked before the card is touched: the path must name an executable regular file, or the
load is refused with ``touched=False`` and a message naming the path and the flag that sets
it. It runs without a shell (its arguments are never parsed twice), in a session of its
own so that a timeout kills the tool and every child it started (``xbutil`` and the SDK's
tools fork helpers) rather than leaving them holding the card, with stdin closed so a
prompt cannot hang it. Only the last few KiB of what it prints are kept: enough for its
error message, never a tool's megabytes of progress output in memory.

A library image is never handed to a tool by its library path, which the tool would read
again after the checks: it gets a sealed in-memory copy of the bytes that were checked and
hashed (:mod:`.sealed`), so a file replaced in between cannot load unvetted bytes.

The card lock a load runs under (:mod:`plugin.programming.card_state`) is handed to the tool
too (:data:`HELD_FDS`): the tool holds a copy of the locked descriptor, so the card stays
locked until the tool exits, even when the process that started it is killed first.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO, TypeVar

from plugin.programming.loaders.base import LoadFailed, LoadJob
from plugin.programming.loaders.sealed import sealed_copy

OUTPUT_TAIL_BYTES = 4096
"""What is kept of each of a tool's output streams: the end, where its error is."""
MESSAGE_LINES = 8
"""Lines of a failed tool's output quoted in the :class:`LoadFailed` detail."""
KILL_GRACE = 5.0
"""Seconds a killed tool's process group gets to be reaped before it is given up on."""
STOP_POLL = 0.1
"""Seconds between two looks, while a tool runs, at whether its load was stopped."""
HELD_FDS: ContextVar[tuple[int, ...]] = ContextVar("held_fds", default=())
"""Descriptors every tool started in this context inherits: the card lock of the load
(set by :class:`~plugin.programming.loaders.card_locked.CardLockedLoader`)."""
STOP: ContextVar[threading.Event | None] = ContextVar("stop_load", default=None)
"""Set when the caller of the load under way in this context gave up on it (the
``serve`` path's task cancelled: :func:`in_thread`): the tool it runs is killed."""
_T = TypeVar("_T")


class Stopped(Exception):
    """The load was stopped by its caller and its tool killed: the card's state is unknown
    (not a :class:`LoadFailed`, so the card's record calls the load interrupted)."""


@dataclass(frozen=True)
class ToolOutput:
    """What a finished tool said: its exit status and the end of each stream."""

    returncode: int
    stdout: str
    stderr: str

    def tail(self, lines: int = MESSAGE_LINES) -> str:
        """The last ``lines`` non-empty lines, stderr first (where tools print errors)."""
        text = [line.strip() for line in (self.stderr + "\n" + self.stdout).splitlines()]
        shown = [line for line in text if line][-lines:]
        return " | ".join(shown) if shown else "(no output)"


def tool_problem(path: Path, flag: str) -> str | None:
    """Why ``path`` cannot be run as the tool ``flag`` names, or None when it can."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return f"{path} does not exist (set its path with {flag})"
    except OSError as exc:
        return f"{path} cannot be examined: {exc.strerror} (set its path with {flag})"
    if not stat.S_ISREG(info.st_mode):
        return f"{path} is not a regular file (set the tool's path with {flag})"
    if not os.access(path, os.X_OK):
        return f"{path} is not executable by this process (set the tool's path with {flag})"
    return None


def run_tool_blocking(path: Path, args: list[str], *, step: str, flag: str, timeout: float,
                      pass_fds: tuple[int, ...] = ()) -> ToolOutput:
    """Run ``path args...``; its output once it exits, whatever its status. Blocks the
    calling thread (the ``loader`` process's connection thread, or :func:`in_thread`'s).

    :class:`LoadFailed` (``touched=False``) when the tool cannot be started, and
    (``touched=True``: it may have started loading) when it outlives ``timeout`` seconds,
    after killing its whole process group; :class:`Stopped`, the group killed too, when
    the load is stopped (:data:`STOP`) meanwhile.
    """
    problem = tool_problem(path, flag)
    if problem is not None:
        raise LoadFailed(step, problem, touched=False)
    try:
        process = subprocess.Popen(
            [str(path), *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True, env=_environment(),
            pass_fds=(*pass_fds, *HELD_FDS.get()))
    except OSError as exc:
        raise LoadFailed(step, f"{path} could not be started: {exc.strerror} (set its path "
                               f"with {flag})", touched=False) from None
    assert process.stdout is not None and process.stderr is not None
    out, err = _Tail(process.stdout), _Tail(process.stderr)
    deadline = time.monotonic() + timeout
    stop = STOP.get()
    try:
        while not _exited(process, min(STOP_POLL, deadline - time.monotonic())):
            if stop is not None and stop.is_set():
                raise Stopped(f"{path.name} was killed (process group {process.pid}): its "
                              "load was stopped")
            if time.monotonic() >= deadline:
                _kill(process)
                output = ToolOutput(-signal.SIGKILL, out.result(KILL_GRACE),
                                    err.result(KILL_GRACE))
                raise LoadFailed(step, f"{path.name} did not finish within {timeout:g} s and "
                                       f"was killed (process group {process.pid}); its last "
                                       f"output: {output.tail()}")
    except BaseException:  # the tool must not outlive the load it was part of
        _kill(process)
        raise
    return ToolOutput(process.returncode or 0, out.result(None), err.result(None))


async def run_tool(path: Path, args: list[str], *, step: str, flag: str,
                   timeout: float, pass_fds: tuple[int, ...] = ()) -> ToolOutput:
    """:func:`run_tool_blocking` off the event loop; cancelled, the tool is killed."""
    return await in_thread(lambda: run_tool_blocking(path, args, step=step, flag=flag,
                                                     timeout=timeout, pass_fds=pass_fds))


async def in_thread(call: Callable[[], _T]) -> _T:
    """``call()`` in a worker thread, in a copy of this context (:data:`HELD_FDS`), for the
    ``serve`` path's async loaders: one blocking core serves both processes. Cancelled,
    it stops the call (:data:`STOP`: a running tool is killed) and returns only once the
    call has ended, so nothing it started outlives the cancelled load.

    asyncio is imported here, not at the top: the ``loader`` process, which only blocks,
    never holds it (nor the ssl it imports)."""
    import asyncio

    stop = threading.Event()
    context = contextvars.copy_context()
    context.run(STOP.set, stop)
    running = asyncio.get_running_loop().run_in_executor(None, context.run, call)
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        stop.set()
        await asyncio.wait({running})
        if not running.cancelled():
            running.exception()  # retrieved: the cancellation is what is raised
        raise


def failure(path: Path, output: ToolOutput) -> str:
    """The detail of a tool that exited unsuccessfully: its status and its last words."""
    code = output.returncode
    if code < 0:
        try:
            how = f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"was killed by signal {-code}"
    else:
        how = f"exited with status {code}"
    return f"{path.name} {how}: {output.tail()}"


def _environment() -> dict[str, str]:
    """The plugin's environment, with messages in the C locale so they read the same
    in every log and can be matched by the parsers here."""
    env = dict(os.environ)
    env["LC_ALL"] = "C"
    return env


def _exited(process: subprocess.Popen[bytes], wait: float) -> bool:
    try:
        process.wait(max(wait, 0))
    except subprocess.TimeoutExpired:
        return False
    return True


class _Tail:
    """The end of one of a tool's output streams, read to its end by a thread of its own
    (two pipes, read at once: a tool blocked writing one never waits for the other)."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._kept = bytearray()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True,
                                        name="tool output")
        self._thread.start()

    def _read(self, stream: IO[bytes]) -> None:
        with stream:
            while chunk := os.read(stream.fileno(), 65536):
                self._kept += chunk
                if len(self._kept) > OUTPUT_TAIL_BYTES:
                    del self._kept[:-OUTPUT_TAIL_BYTES]

    def result(self, wait: float | None) -> str:
        """The stream's tail once it ends; what came so far if it is still open after
        ``wait`` seconds (a grandchild that escaped the killed group keeps it open)."""
        self._thread.join(wait)
        return bytes(self._kept).decode("utf-8", "replace")


def _kill(process: subprocess.Popen[bytes]) -> None:
    if process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(KILL_GRACE)


def load_library_image(job: LoadJob, problem: str | None,
                       check: Callable[[LoadJob, BinaryIO, int], object], tool: Path,
                       args_for: Callable[[str, str], list[str]], step: str,
                       flag: str) -> None:
    """What every loader that hands a vendor tool a library file does: refuse (untouched)
    when the loader's ``problem`` says so; copy the image once into sealed memory, hashing
    it (:mod:`.sealed`: refused when the job pins another digest); refuse when the
    ``check`` of that copy's header says so; run ``tool`` with ``args_for(pci_address,
    path of the copy)``, the copy's descriptor passed down; fail with the tool's own words
    when it exits non-zero."""
    if problem is not None:
        raise LoadFailed(step, problem, touched=False)
    with sealed_copy(job) as image:
        with image.stream() as stream:
            check(job, stream, image.size)
        output = run_tool_blocking(tool, args_for(job.device.attrs["pci_address"],
                                                  image.path),
                                   step=step, flag=flag, timeout=job.timeout,
                                   pass_fds=(image.fd,))
    if output.returncode != 0:
        raise LoadFailed(step, failure(tool, output))
