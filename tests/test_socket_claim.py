"""Telling a live socket from a stale one, and never removing a live one."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from plugin.socket_claim import PathState, probe


def test_absent_stale_live_and_not_a_socket(tmp_path: Path) -> None:
    path = tmp_path / "a.sock"
    assert probe(path).state is PathState.ABSENT

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(str(path))  # bound, never listening: what a killed server leaves
    assert probe(path).state is PathState.STALE

    path.unlink()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as live:
        live.bind(str(path))
        live.listen()
        found = probe(path)
        assert found.state is PathState.LIVE
        assert found.holder_pid == os.getpid()
        assert str(os.getpid()) in found.describe()

    path.unlink()
    path.write_text("left over\n")
    assert probe(path).state is PathState.STALE
