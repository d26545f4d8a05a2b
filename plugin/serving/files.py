"""Files a reader must see whole: written beside their place, then renamed over it.

Container runtimes read CDI specs while the plugin rewrites them, and the DRA driver reads its
checkpoint after a restart at any instant: both must see the old content or the new, never a
part. A temporary file in the same directory (same file system, so the rename is atomic),
named ``.<name>.<random>.tmp`` so that readers globbing ``*.json`` skip it, then ``rename``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def replace_atomically(path: Path, text: str, *, mode: int = 0o644, sync: bool = True) -> None:
    """Put ``text`` at ``path`` whole. ``sync`` flushes it to disk before the rename, for
    files that must survive a power cut as well as a process exit."""
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            if sync:
                handle.flush()
                os.fsync(handle.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
