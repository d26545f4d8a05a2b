"""Telling a live socket from a stale one, and never removing a live one."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import tempfile
from pathlib import Path

from api_versions.negotiate import adapters
from api_versions.retry import RetryPolicy
from plugin.model.feed import DeviceFeed
from plugin.serving.deviceplugin.server import ResourceServer
from plugin.serving.deviceplugin.timing import Timing
from plugin.serving.socket_claim import PathState, probe


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


async def test_a_waiting_server_reminds_and_never_touches_the_live_socket(caplog) -> None:
    directory = Path(tempfile.mkdtemp(prefix="dps", dir="/tmp"))
    path = directory / "a.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as holder:
        holder.bind(str(path))
        holder.listen()
        inode = os.stat(path).st_ino
        server = ResourceServer("example.com/fpga", directory, "a.sock", DeviceFeed(),
                                adapters(), RetryPolicy(),
                                Timing(holder_poll=0.05, holder_reminder=0.3))
        caplog.set_level(logging.WARNING, logger="plugin.serving.deviceplugin")
        task = asyncio.create_task(server.run())
        await asyncio.sleep(0.8)
        server.stop()
        await asyncio.wait_for(task, 5)
        assert os.stat(path).st_ino == inode, "the live socket was left alone"
    warnings = [r.getMessage() for r in caplog.records]
    assert sum("Waiting for it to stop" in m for m in warnings) == 1
    assert any("still waiting after" in m for m in warnings), warnings
    path.unlink()
    directory.rmdir()
