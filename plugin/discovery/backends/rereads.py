"""Re-reading the same few sysfs files every half second for the cost of one system call each.

The monitor re-reads the files that decide health but announce nothing (a port's ``afu_id``
and error register) between full scans. Opening a file costs a path walk, an fstat and a
close besides the read; keeping each file open and reading it again with ``pread`` costs the
read alone, which halves what an idle plugin spends on these re-reads.

A kept descriptor follows the file, not the path. That is what sysfs wants: an attribute
changes in place, and when its device goes away the kernel fails reads of every descriptor
still open on it, which reads as a change. A file *replaced* at the same path (which sysfs
never does, but a damaged tree might) is noticed by the next full scan, which opens
everything anew. A path that was not a readable regular file when the scan opened it is
re-read by path each time, so it is noticed as soon as it becomes one.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Sequence
from pathlib import Path

from plugin.discovery.backends.sysfs import reread_all

MAX_KEPT_OPEN = 256
"""Files kept open at most; any beyond are re-read by path. 128 ports' worth, far below the
descriptor limit a container gets, so a huge node cannot starve gRPC of descriptors."""

Reading = tuple[bytes | None, ...]


class KeptFiles:
    """One set of files, opened once, read again on demand; for a single thread's use."""

    def __init__(self) -> None:
        self._paths: tuple[Path, ...] = ()
        self._fds: list[int | None] = []
        self._lock = threading.Lock()
        self.last: Reading = ()
        """What the latest read found, file by file; None where a file could not be read."""

    def reset(self, paths: Sequence[Path]) -> None:
        """Close the current files, open ``paths`` and take their reading as the new baseline."""
        with self._lock:
            self._close()
            self._paths = tuple(paths)
            self._fds = [_open_regular(p) if n < MAX_KEPT_OPEN else None
                         for n, p in enumerate(self._paths)]
            self.last = self._read()

    def changed(self) -> bool:
        """Read every file again; whether anything differs from the previous reading."""
        with self._lock:
            now = self._read()
            if now == self.last:
                return False
            self.last = now
            return True

    def close(self) -> None:
        with self._lock:
            self._close()
            self._paths, self.last = (), ()

    def _close(self) -> None:
        for fd in self._fds:
            if fd is not None:
                os.close(fd)
        self._fds = []

    def _read(self) -> Reading:
        return reread_all(self._fds, self._paths)


def _open_regular(path: Path) -> int | None:
    """A descriptor on ``path`` if it is a regular file (sysfs attributes are), else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None

