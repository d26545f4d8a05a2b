"""One blocking core per loader, for both processes that load.

The ``loader`` process calls the loaders' blocking cores in its connection threads; ``serve``
(loading in its own process) awaits the same cores run in a worker thread
(:func:`~plugin.programming.loaders.tools.in_thread`). What the async path promised before
still holds: a load cancelled while its tool runs kills the tool's whole process group,
ends only once the tool is gone, and leaves the card's record saying the load was
interrupted (its state unknown). The card lock is waited for in a thread as it is awaited.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from plugin.programming.card_state import INTERRUPTED_PREFIX, CardBusy, CardFiles
from plugin.programming.loaders.base import LoadJob
from plugin.programming.loaders.card_locked import CardLockedLoader
from plugin.programming.loaders.tools import run_tool_blocking
from value_types.devices import Device

FME = "/dev/dfl-fme.0"
PORT = "0000:3b:00.0"


def port() -> Device:
    return Device(id=PORT, backend="intel", attributes=(("fme_node", FME),
                                                        ("pci_address", PORT)))


class SlowTool:
    """A loader whose load runs a tool that writes its PID, then sleeps."""

    name = "slow-tool"
    family = "intel"

    def __init__(self, tool: Path) -> None:
        self.tool = tool

    def unavailable(self, device: Device) -> str | None:
        return None

    def load_blocking(self, job: LoadJob) -> None:
        run_tool_blocking(self.tool, [], step="tool", flag="--tool", timeout=job.timeout)

    def loaded_blocking(self, device: Device) -> str | None:
        return None

    async def load(self, job: LoadJob) -> None:
        from plugin.programming.loaders.tools import in_thread

        await in_thread(lambda: self.load_blocking(job))

    async def loaded(self, device: Device) -> str | None:
        return None


def slow_tool(tmp_path: Path) -> tuple[Path, Path]:
    pid_file = tmp_path / "tool.pid"
    tool = tmp_path / "tool"
    tool.write_text(f"#!/bin/sh\necho $$ > {pid_file}.tmp\nmv {pid_file}.tmp {pid_file}\n"
                    "exec sleep 60\n")
    tool.chmod(0o755)
    return tool, pid_file


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_a_cancelled_serve_load_kills_its_tool_and_is_recorded_interrupted(
        tmp_path: Path) -> None:
    tool, pid_file = slow_tool(tmp_path)
    files = CardFiles(tmp_path / "state")
    loading = asyncio.create_task(CardLockedLoader(SlowTool(tool), files).load(
        LoadJob(port(), "f" * 32, image="x.gbs", timeout=60)))
    for _ in range(500):
        if pid_file.exists():
            break
        await asyncio.sleep(0.02)
    pid = int(pid_file.read_text())
    assert alive(pid)
    loading.cancel()
    with pytest.raises(asyncio.CancelledError):
        await loading
    assert not alive(pid), "the tool outlived its cancelled load"
    record = files.read(FME)
    assert record.intent is None
    assert record.quarantined[PORT].startswith(INTERRUPTED_PREFIX)
    assert files.try_lock(FME) is not None  # the card is free again


def test_the_card_lock_is_waited_for_in_a_thread_until_its_deadline(tmp_path: Path) -> None:
    files = CardFiles(tmp_path)
    held = files.try_lock(FME)
    assert held is not None
    with pytest.raises(CardBusy) as busy:
        files.lock_blocking(FME, time.monotonic() + 0.2)
    assert "another process holds the card lock" in busy.value.holder
    held.release()
    with files.lock_blocking(FME, time.monotonic() + 5) as lock:
        assert lock.fd >= 0 and files.try_lock(FME) is None
