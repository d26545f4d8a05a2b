"""inotify on a few directories, as an async stream of plain events.

Used twice: on the kubelet's device-plugin directory (our socket deleted, ``kubelet.sock``
created again) and on the directories a discovery backend names (device nodes appearing or
disappearing). Event-driven so reactions take milliseconds and an idle plugin sleeps; every
user of this module also keeps a slow periodic check, because inotify can overflow, a
directory can be replaced, and some filesystems give no events at all.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from asyncinotify import Inotify, Mask, Watch

log = logging.getLogger(__name__)

_MASK = (
    Mask.CREATE
    | Mask.DELETE
    | Mask.MOVED_FROM
    | Mask.MOVED_TO
    | Mask.ATTRIB
    | Mask.DELETE_SELF
    | Mask.MOVE_SELF
    | Mask.ONLYDIR
)


class Change(StrEnum):
    CREATED = "created"
    DELETED = "deleted"
    CHANGED = "changed"
    DIRECTORY_GONE = "directory-gone"
    OVERFLOW = "overflow"


@dataclass(frozen=True)
class DirEvent:
    directory: Path
    name: str | None
    change: Change


class DirectoryWatcher:
    """Watches directories that exist; ``watch`` again later for ones that do not exist yet."""

    def __init__(self) -> None:
        self._watches: dict[Path, Watch] = {}
        self._refused: dict[Path, str] = {}
        try:
            self._inotify: Inotify | None = Inotify()
        except OSError as exc:
            log.warning("inotify unavailable (%s); relying on periodic checks only", exc)
            self._inotify = None

    @property
    def available(self) -> bool:
        """Whether inotify works here at all (a container may have no instances left)."""
        return self._inotify is not None

    def watch(self, directory: Path) -> bool:
        """Start watching ``directory``; False if it does not exist yet (not an error) or
        cannot be watched (see :meth:`refusal`)."""
        if self._inotify is None:
            return False
        if directory in self._watches:
            return True
        try:
            self._watches[directory] = self._inotify.add_watch(directory, _MASK)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                log.debug("cannot watch %s yet: %s", directory, exc)
                self._refused.pop(directory, None)
                return False
            reason = exc.strerror or str(exc)
            if exc.errno == errno.ENOSPC:
                reason += " (the node's fs.inotify.max_user_watches is used up)"
            if self._refused.get(directory) != reason:
                log.warning("cannot watch %s: %s", directory, reason)
            self._refused[directory] = reason
            return False
        self._refused.pop(directory, None)
        return True

    def refusal(self, directory: Path) -> str | None:
        """Why the last :meth:`watch` of an existing ``directory`` failed, None if it did not.

        A directory that exists and cannot be watched (the inotify watch limit, permissions)
        means its changes go unheard, which its user must make up for by checking more often.
        """
        return self._refused.get(directory)

    async def events(self) -> AsyncIterator[DirEvent]:
        if self._inotify is None:
            return
        async for event in self._inotify:
            if event.mask & Mask.Q_OVERFLOW:
                yield DirEvent(Path("/"), None, Change.OVERFLOW)
                continue
            if event.watch is None:
                continue
            directory = Path(event.watch.path)
            if event.mask & (Mask.DELETE_SELF | Mask.MOVE_SELF | Mask.IGNORED):
                self._watches.pop(directory, None)
                yield DirEvent(directory, None, Change.DIRECTORY_GONE)
                continue
            name = str(event.name) if event.name is not None else None
            if event.mask & (Mask.CREATE | Mask.MOVED_TO):
                change = Change.CREATED
            elif event.mask & (Mask.DELETE | Mask.MOVED_FROM):
                change = Change.DELETED
            else:
                change = Change.CHANGED
            yield DirEvent(directory, name, change)

    def close(self) -> None:
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None
        self._watches.clear()
