"""The kubelet's device-plugin directory as a starting kubelet treats it.

A kubelet wipes the directory at start (all but its checkpoint) and joins a plugin's
endpoint under it the way Go's ``filepath.Join`` does; the emulator refuses to wipe a
directory other things share.
"""

from __future__ import annotations

import os
from pathlib import Path

CHECKPOINT = "kubelet_internal_checkpoint"
# Starting wipes the directory; a typo must not empty one of these.
SHARED_DIRECTORIES = frozenset({"/", "/tmp", "/var/tmp", "/dev/shm", "/var", "/var/lib", "/root",
                                 "/home", str(Path.home())})


def clean_directory(directory: Path) -> list[str]:
    """Delete every file but the checkpoint, as a starting kubelet does; return the names."""
    removed = []
    for entry in sorted(directory.iterdir()):
        if entry.name == CHECKPOINT or entry.is_dir():
            continue
        entry.unlink(missing_ok=True)
        removed.append(entry.name)
    return removed


def endpoint_path(directory: Path, endpoint: str) -> Path:
    """Go's filepath.Join(dir, endpoint): an absolute endpoint is still under ``dir``."""
    return Path(os.path.normpath(os.path.join(directory, endpoint.lstrip("/"))))
