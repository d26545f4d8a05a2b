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

import asyncio
import contextlib
import os
import signal
import stat
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from plugin.programming.loaders.base import LoadFailed, LoadJob
from plugin.programming.loaders.sealed import sealed_copy

OUTPUT_TAIL_BYTES = 4096
"""What is kept of each of a tool's output streams: the end, where its error is."""
MESSAGE_LINES = 8
"""Lines of a failed tool's output quoted in the :class:`LoadFailed` detail."""
KILL_GRACE = 5.0
"""Seconds a killed tool's process group gets to be reaped before it is given up on."""
HELD_FDS: ContextVar[tuple[int, ...]] = ContextVar("held_fds", default=())
"""Descriptors every tool started in this context inherits: the card lock of the load
(set by :class:`~plugin.programming.loaders.card_locked.CardLockedLoader`)."""


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


async def run_tool(path: Path, args: list[str], *, step: str, flag: str,
                   timeout: float, pass_fds: tuple[int, ...] = ()) -> ToolOutput:
    """Run ``path args...``; its output once it exits, whatever its status.

    :class:`LoadFailed` (``touched=False``) when the tool cannot be started, and
    (``touched=True``: it may have started loading) when it outlives ``timeout`` seconds,
    after killing its whole process group.
    """
    problem = tool_problem(path, flag)
    if problem is not None:
        raise LoadFailed(step, problem, touched=False)
    try:
        process = await asyncio.create_subprocess_exec(
            str(path), *args, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True, env=_environment(),
            pass_fds=(*pass_fds, *HELD_FDS.get()))
    except OSError as exc:
        raise LoadFailed(step, f"{path} could not be started: {exc.strerror} (set its path "
                               f"with {flag})", touched=False) from None
    assert process.stdout is not None and process.stderr is not None
    out = asyncio.ensure_future(_tail(process.stdout))
    err = asyncio.ensure_future(_tail(process.stderr))
    try:
        await asyncio.wait_for(process.wait(), timeout)
    except TimeoutError:
        await _kill(process)
        output = ToolOutput(-signal.SIGKILL, await _finished(out), await _finished(err))
        raise LoadFailed(step, f"{path.name} did not finish within {timeout:g} s and was "
                               f"killed (process group {process.pid}); its last output: "
                               f"{output.tail()}") from None
    except BaseException:  # cancelled: the tool must not outlive the load it was part of
        await _kill(process)
        out.cancel()
        err.cancel()
        raise
    return ToolOutput(process.returncode or 0, await out, await err)


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


async def _tail(stream: asyncio.StreamReader) -> str:
    kept = bytearray()
    while chunk := await stream.read(65536):
        kept += chunk
        if len(kept) > OUTPUT_TAIL_BYTES:
            del kept[:-OUTPUT_TAIL_BYTES]
    return kept.decode("utf-8", "replace")


async def _finished(task: asyncio.Future[str]) -> str:
    """A stream's tail once the killed tool's pipes close; empty if a grandchild that
    escaped the group keeps them open."""
    try:
        return await asyncio.wait_for(asyncio.shield(task), KILL_GRACE)
    except TimeoutError:
        task.cancel()
        return ""


async def _kill(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(process.wait(), KILL_GRACE)


async def load_library_image(job: LoadJob, problem: str | None,
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
        output = await run_tool(tool, args_for(job.device.attrs["pci_address"], image.path),
                                step=step, flag=flag, timeout=job.timeout,
                                pass_fds=(image.fd,))
    if output.returncode != 0:
        raise LoadFailed(step, failure(tool, output))
