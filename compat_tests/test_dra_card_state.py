"""One card, several processes that may program it: the card lock and records, for real.

The real ``serve`` (DRA, ``--programming on``), with its loaders in-process or in the real
``loader`` process, killed with SIGKILL in the middle of a slow load (the stand-in tools
take seconds, and log when each run starts and ends), then started again on the same state
directory: a device whose load was cut off is never published Healthy, a loader that
outlives its driver records its own outcome, and two driver + loader pairs overlapping (as
a rolling update's two pods do) never program one card at the same time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from compat_tests.dra_support import until
from compat_tests.fake_sysfs import DEFAULT_INTERFACE_ID
from compat_tests.fpga_images import NLB0_AFU_ID, NLB3_AFU_ID, build_gbs, write_image
from compat_tests.plugin_process import PluginProcess
from compat_tests.test_dra_loader_process import IMAGE, LoaderProcess, loader_flags, world_with
from compat_tests.test_dra_programming_serve import (
    DFL_PORT,
    DRIVER,
    NLB3,
    NODE,
    World,
    function,
    running,
)
from plugin.programming.ids import dashed

NLB3_CONFIG = function(afuID=NLB3_AFU_ID, image=IMAGE)
SLOW = 4.0
"""Seconds each stand-in load takes: long enough to kill a process in the middle of one."""
LONGER = ("--program-timeout", "30")
"""Room for a slow load, and for a second one waiting for it."""


@pytest.fixture
def loader_socket(sockdir: Path) -> Path:
    return sockdir / "loader" / "l.sock"


def taint_of(world: World) -> str | None:
    taints = world.published()[DFL_PORT]["taints"]
    return taints[0].get("value") if taints else None


def health_of(world: World) -> str | None:
    assert world.kubelet.dra is not None
    record = world.kubelet.dra.health(DRIVER).get((NODE, DFL_PORT))
    return None if record is None else record.health


def records(state: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((state / "cards").glob("*.json"))]


async def started_load(world: World, count: int = 1) -> None:
    await until(lambda: len(world.tools.spans("fpgaconf")) >= count, "the stand-in load begun")


@contextlib.asynccontextmanager
async def preparing(world: World, name: str, config: dict[str, Any]
                    ) -> AsyncIterator[asyncio.Task[Any]]:
    """A prepare under way (cancelled if the test leaves it)."""
    task = asyncio.create_task(world.prepare(world.claim(name, DFL_PORT, config)))
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(BaseException):
            await task


@pytest.fixture
async def slow(tmp_path: Path, sockdir: Path, logdir: Path) -> AsyncIterator[World]:
    """serve with its loaders in-process, each stand-in load taking :data:`SLOW` s."""
    async for w in running(tmp_path, sockdir, logdir, delay=SLOW):
        yield w


async def test_a_driver_killed_mid_load_comes_back_with_the_device_unhealthy_until_reloaded(
        slow: World, sockdir: Path) -> None:
    world = slow
    async with preparing(world, "nlb3", function(afuID=NLB3_AFU_ID, image="intel/nlb3.gbs")):
        await started_load(world)
        world.plugin.kill()  # SIGKILL, the tool still running (it keeps the card locked)
    assert world.kubelet.dra is not None
    stale = world.kubelet.dra.health(DRIVER).get((NODE, DFL_PORT))  # the first process's
    world.plugin = world.restart("plugin-again")
    seen: list[str] = []

    def told() -> bool:
        assert world.kubelet.dra is not None
        record = world.kubelet.dra.health(DRIVER).get((NODE, DFL_PORT))
        if record is not None and record is not stale:
            seen.append(record.health)
        return taint_of(world) == "load-interrupted" and "Unhealthy" in seen

    await until(told, "the device tainted and Unhealthy: its load was interrupted", 30.0)
    # Never Healthy after the restart, before or after the interrupted load was judged.
    assert "Healthy" not in seen, seen
    assert "state unknown after a load was interrupted" in world.plugin.text()
    [record] = records(sockdir / "state")
    assert record["intent"] is None and "interrupted" in next(
        iter(record["quarantined"].values()))
    # The orphaned tool finished writing its AFU ID: not trusted, loaded again.
    await until(lambda: world.published()[DFL_PORT]["afuID"] == NLB3, "the tool's write")
    runs = len(world.tools.spans("fpgaconf"))
    result = await world.prepare(world.claim("nlb3-again", DFL_PORT, function(
        afuID=NLB3_AFU_ID, image="intel/nlb3.gbs")))
    assert result.ok, result.error
    assert len(world.tools.spans("fpgaconf")) == runs + 1
    await until(lambda: taint_of(world) is None, "untainted")
    await until(lambda: health_of(world) == "Healthy", "Healthy again")
    assert records(sockdir / "state") == []


async def test_a_loader_killed_mid_load_fails_the_claim_and_quarantines_the_device(
        tmp_path: Path, sockdir: Path, logdir: Path, loader_socket: Path) -> None:
    async with world_with(tmp_path, sockdir, logdir, loader_socket, True,
                          delay=SLOW) as (world, loader):
        assert loader is not None
        async with preparing(world, "nlb3", NLB3_CONFIG) as prepare:
            await started_load(world)
            loader.stop()  # SIGKILL
            result = await prepare
        assert "failed at loader answer" in result.error and "unknown" in result.error
        await until(lambda: taint_of(world) == "load-failed", "the device tainted")
        [record] = records(sockdir / "state")
        assert record["intent"]["device"] and record["quarantined"]  # both kept
        assert world.plugin.alive


async def test_a_loader_outliving_its_driver_records_a_failure_the_next_driver_reads(
        tmp_path: Path, sockdir: Path, logdir: Path, loader_socket: Path) -> None:
    async with world_with(tmp_path, sockdir, logdir, loader_socket, True, delay=SLOW,
                          fail="PR failed: timeout", extra=LONGER) as (world, loader):
        assert loader is not None
        async with preparing(world, "nlb3", NLB3_CONFIG):
            await started_load(world)
            world.plugin.kill()
        await until(lambda: world.tools.spans("fpgaconf")[0][1] is not None,
                    "the loader's tool done", 30.0)
        # The loader recorded its own failure: nobody else was there to.
        await until(lambda: [r for r in records(sockdir / "state") if r["intent"] is None
                             and "PR failed: timeout" in json.dumps(r["quarantined"])],
                    "the failure in the card's record")
        await until(lambda: any("PR failed: timeout" in m for m in loader.messages()),
                    "the loader's own word on it")
        world.plugin = world.restart("plugin-again")
        await until(lambda: taint_of(world) == "load-failed", "tainted by the loader's record")
        await until(lambda: health_of(world) == "Unhealthy", "Unhealthy")


async def test_a_loader_outliving_its_driver_removes_the_record_of_a_load_that_worked(
        tmp_path: Path, sockdir: Path, logdir: Path, loader_socket: Path) -> None:
    async with world_with(tmp_path, sockdir, logdir, loader_socket, True, delay=SLOW,
                          extra=LONGER) as (world, loader):
        assert loader is not None
        async with preparing(world, "nlb3", NLB3_CONFIG):
            await started_load(world)
            world.plugin.kill()
        assert records(sockdir / "state")  # the intent, while it loads
        await until(lambda: world.tools.spans("fpgaconf")[0][1] is not None,
                    "the loader's tool done", 30.0)
        await until(lambda: records(sockdir / "state") == [], "the record removed")
        world.plugin = world.restart("plugin-again")
        await until(lambda: world.published()[DFL_PORT]["afuID"] == NLB3, "the new function")
        await until(lambda: health_of(world) == "Healthy", "Healthy")
        assert taint_of(world) is None


async def test_two_driver_and_loader_pairs_never_program_one_card_at_once(
        tmp_path: Path, sockdir: Path, logdir: Path, loader_socket: Path) -> None:
    """A rolling update's two pods, each a driver and its loader, on one state directory:
    the old driver dies while its loader loads the card; the newcomer's load of the same
    card, through its own loader, waits for that one to end."""
    async with world_with(tmp_path, sockdir, logdir, loader_socket, True, delay=SLOW,
                          extra=LONGER) as (world, first):
        assert first is not None
        write_image(world.library, "intel/nlb0.gbs", build_gbs(
            afu_ids=(NLB0_AFU_ID,), interface_id=dashed(DEFAULT_INTERFACE_ID)))
        second_socket = loader_socket.parent.parent / "loader-2" / "l.sock"
        node_flags = ["--backend", "auto", "--sysfs-root", str(world.node.sysfs_root),
                      "--dev-root", str(world.node.dev_root), "--image-library",
                      str(world.library)]
        second = LoaderProcess(loader_flags(node_flags, second_socket, world.tools.fpgaconf,
                                            sockdir), logdir / "loader-2.log")
        newcomer: PluginProcess | None = None
        try:
            await until(second_socket.exists, "the second loader's socket")
            async with preparing(world, "nlb3", NLB3_CONFIG):
                await started_load(world)
                world.plugin.kill()  # the old pod's driver ends; its loader goes on
            newcomer = world.restart("newcomer", "--loader-socket", str(second_socket))
            world.plugin = newcomer
            ref = world.claim("nlb0", DFL_PORT, function(afuID=NLB0_AFU_ID,
                                                         image="intel/nlb0.gbs"))
            result = None
            for _ in range(100):  # until the newcomer serves the socket
                with contextlib.suppress(KeyError):  # no driver registered yet
                    result = await world.prepare(ref)
                if result is not None and result.answered:
                    break
                await asyncio.sleep(0.2)
            assert result is not None and result.ok, result
            spans = world.tools.spans("fpgaconf")
            assert len(spans) == 2 and all(end is not None for _, end in spans), spans
            (_, first_end), (second_start, _) = spans
            assert first_end is not None and first_end <= second_start, (
                f"the two loads overlapped: {spans}")
            assert any("loading" in m for m in second.messages())
            await until(lambda: world.published()[DFL_PORT]["afuID"]
                        == NLB0_AFU_ID.replace("-", ""), "the newcomer's function")
        finally:
            second.stop()
