"""Files a reader must see whole: written beside their place, then renamed over it.

Container runtimes read CDI specs while the plugin rewrites them, the DRA driver reads its
checkpoint after a restart at any instant, and the driver and the ``loader`` process read each
other's card records: each must see the old content or the new, never a part. Here, below
both serving and programming, so the privileged loader writes its records without importing
any serving code. A temporary file in the same directory (same file system, so the rename
is atomic), named ``.<name>.<random>.tmp`` so that readers globbing ``*.json`` skip it, then
``rename``.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC


def replace_atomically(path: Path, text: str, *, mode: int = 0o644, sync: bool = True) -> None:
    """Put ``text`` at ``path`` whole. ``sync`` flushes it to disk before the rename, for
    files that must survive a power cut as well as a process exit.

    Plain descriptor calls, no file object: a DRA prepare writes a claim's spec on its
    critical path, and on a tmpfs the buffered-file layers cost as much as the writing.
    ``O_EXCL`` on a random name keeps two writers (two instances during a rolling update)
    off each other's temporary file."""
    directory, name = os.path.split(path)
    temporary = os.path.join(directory, f".{name}.{os.urandom(6).hex()}.tmp")
    data = text.encode()
    fd = os.open(temporary, _FLAGS, mode)
    try:
        try:
            os.fchmod(fd, mode)  # what the umask took away
            written = 0
            while written < len(data):
                written += os.write(fd, data[written:])
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
