"""The directory watcher tells a directory that is not there yet from one it cannot watch."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest

from plugin.process import dirwatch
from plugin.process.dirwatch import DirectoryWatcher


def test_a_missing_directory_is_no_refusal(tmp_path: Path) -> None:
    watcher = DirectoryWatcher()
    try:
        assert watcher.watch(tmp_path / "not-yet") is False
        assert watcher.refusal(tmp_path / "not-yet") is None
        assert watcher.watch(tmp_path) is True
    finally:
        watcher.close()


def test_a_refused_watch_is_said_once_with_its_reason_and_forgotten_once_it_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    real_add_watch = dirwatch.Inotify.add_watch
    limit_reached = True

    def add_watch(self, path, mask):  # type: ignore[no-untyped-def]
        if limit_reached:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_add_watch(self, path, mask)

    monkeypatch.setattr(dirwatch.Inotify, "add_watch", add_watch)
    watcher = DirectoryWatcher()
    try:
        with caplog.at_level(logging.WARNING):
            for _ in range(3):
                assert watcher.watch(tmp_path) is False
        reason = watcher.refusal(tmp_path)
        assert reason is not None and "max_user_watches" in reason
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and str(tmp_path) in warnings[0], warnings

        limit_reached = False
        assert watcher.watch(tmp_path) is True
        assert watcher.refusal(tmp_path) is None
    finally:
        watcher.close()
