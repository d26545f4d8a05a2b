"""Reading sysfs without ever raising, and reporting what could not be read without flooding logs.

Discovery runs on every event and every few seconds for the life of the node. A single
unreadable attribute must cost one device (or nothing), never the whole scan, and a broken
file that stays broken must be reported once, not every five seconds. So every read here
returns a value or a short explanation, and warnings go through :class:`Notes`.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

MAX_ATTRIBUTE_BYTES = 4096
"""sysfs attributes are at most one page; anything longer is not an attribute."""

_in_progress: dict[int, Path] = {}
"""Thread ID -> the file that thread is reading now (see :func:`reading_now`)."""


@dataclass(frozen=True, slots=True)
class Attr:
    """The stripped text of one attribute file, or why there is none."""

    path: Path
    text: str | None = None
    problem: str = ""

    @property
    def ok(self) -> bool:
        return self.text is not None

    @property
    def missing(self) -> bool:
        return self.problem == "missing"

    def describe(self) -> str:
        """``<path>: <problem>``, the form every warning about a file uses."""
        return f"{self.path}: {self.problem}"


def read_attr(path: Path) -> Attr:
    """Read an attribute file; never raises and never blocks on a FIFO or device.

    The file is opened non-blocking and must be a regular file (sysfs attributes are), so
    a corrupted tree holding a pipe or a socket cannot hang the scan.
    """
    data = _read_regular(path)
    if isinstance(data, str):
        return Attr(path, problem=data)
    try:
        text = data.decode("ascii").strip()
    except UnicodeDecodeError:
        return Attr(path, problem="not ASCII text")
    if not text:
        return Attr(path, problem="empty")
    return Attr(path, text)


def read_contents(paths: Sequence[Path]) -> tuple[bytes | None, ...]:
    """The raw bytes of each file, None where it cannot be read; the same guarantees as
    :func:`read_attr` (never raises, never blocks on a FIFO, bounded in size).

    For the monitor's health re-reads, which only compare one reading with the next.
    """
    contents: list[bytes | None] = []
    for path in paths:
        data = _read_regular(path)
        contents.append(None if isinstance(data, str) else data)
    return tuple(contents)


def _read_regular(path: Path) -> bytes | str:
    """The bytes of a regular file of at most MAX_ATTRIBUTE_BYTES, or what is wrong with it."""
    ident = threading.get_ident()
    _in_progress[ident] = path
    try:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return "missing"
        except (OSError, ValueError) as exc:
            return f"cannot open ({getattr(exc, 'strerror', None) or exc})"
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return "not a regular file"
            data = os.read(fd, MAX_ATTRIBUTE_BYTES + 1)
        except OSError as exc:
            return f"cannot read ({exc.strerror or exc})"
        finally:
            os.close(fd)
    finally:
        _in_progress.pop(ident, None)
    if len(data) > MAX_ATTRIBUTE_BYTES:
        return f"longer than {MAX_ATTRIBUTE_BYTES} bytes"
    return data


def reread_all(fds: Sequence[int | None], paths: Sequence[Path]) -> tuple[bytes | None, ...]:
    """The bytes of each of ``paths``, through ``fds[i]`` (a descriptor kept open on it since
    a scan) where there is one, else by path; None where a file cannot be read.

    Bounded like :func:`read_contents`; a failed pread (the device went away) gives None.
    One tight loop with no Python call per kept file: the monitor runs this twice a second
    for the life of the node, and what surrounds each pread is paid as often as the pread.
    """
    ident = threading.get_ident()
    contents: list[bytes | None] = []
    try:
        for fd, path in zip(fds, paths, strict=True):
            _in_progress[ident] = path
            if fd is None:
                data = _read_regular(path)
                contents.append(None if isinstance(data, str) else data)
                continue
            try:
                read: bytes | None = os.pread(fd, MAX_ATTRIBUTE_BYTES + 1, 0)
            except OSError:
                read = None
            contents.append(read if read is None or len(read) <= MAX_ATTRIBUTE_BYTES else None)
    finally:
        _in_progress.pop(ident, None)
    return tuple(contents)


def reading_now(thread_id: int) -> Path | None:
    """The file thread ``thread_id`` is reading at this moment, if any.

    A read the kernel never answers cannot be interrupted; this at least lets the monitor
    say which file it is stuck on.
    """
    return _in_progress.get(thread_id)


def list_dir(path: Path) -> list[str] | None:
    """Sorted entry names of a directory, or None if it cannot be listed."""
    try:
        return sorted(os.listdir(path))
    except (OSError, ValueError):
        return None


def is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except (OSError, RuntimeError, ValueError):
        return False


def is_link(path: Path) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except (OSError, ValueError):
        return False


def exists(path: Path) -> bool:
    """Whether ``path`` exists after following links; False for loops and dangling links."""
    try:
        os.stat(path)
    except (OSError, ValueError):
        return False
    return True


def real_path(path: Path) -> Path | None:
    """``path`` with every symlink resolved, or None if it dangles, loops or is unreadable."""
    try:
        return path.resolve(strict=True)
    except (OSError, RuntimeError, ValueError):
        return None


def link_target_name(path: Path) -> str | None:
    """The last component of the file a symlink points to, without requiring it to exist."""
    try:
        return Path(os.readlink(path)).name or None
    except (OSError, ValueError):
        return None


class Notes:
    """Warnings of one backend, each logged when it first appears, not on every rescan.

    A scan collects its warnings with :meth:`warn` and hands them over with :meth:`flush`;
    only messages absent from the previous scan are logged (the rest at debug level), so a
    problem that clears and comes back is reported again.
    """

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._lock = threading.Lock()
        self._reported: frozenset[str] = frozenset()

    def start(self) -> list[str]:
        """A fresh list for one scan to append its warnings to."""
        return []

    def flush(self, messages: list[str]) -> None:
        with self._lock:
            current = frozenset(messages)
            for message in dict.fromkeys(messages):
                if message in self._reported:
                    self._logger.debug("still: %s", message)
                else:
                    self._logger.warning("%s", message)
            self._reported = current
