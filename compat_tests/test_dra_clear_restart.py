"""A clear is never lost: ``serve`` killed after a claim left its checkpoint, before its clear.

The real process, the emulated 1.36 API server and kubelet, the fake node and stand-in tools
of :mod:`compat_tests.test_dra_programming_serve`. A DeviceClass loads nlb3 for its claims
and clears the port to nlb0 on unprepare (``clearOnUnprepare``). The driver is killed
(SIGKILL, as an OOM kill or a node agent would) at the one moment that used to lose the
clear: the claim gone from the checkpoint, its clear not yet started. The next instance must
run the clear before it lets any claim have the port, so the next tenant never receives the
previous one's function.
"""

from __future__ import annotations

import asyncio
import json
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from compat_tests.dra_support import recorded_claims, until
from compat_tests.fake_fpga_tools import write_stand_in_tools
from compat_tests.fake_sysfs import DEFAULT_INTERFACE_ID
from compat_tests.fpga_images import NLB0_AFU_ID, NLB3_AFU_ID, build_gbs, write_image
from compat_tests.plugin_process import run_at_start_up
from compat_tests.test_dra_loader_process import world_with
from compat_tests.test_dra_programming_serve import (
    DFL_PORT,
    DRIVER,
    NLB3,
    World,
    function,
    running,
)
from plugin.programming.ids import dashed
from value_types.claims import ClaimRef

NLB0 = NLB0_AFU_ID.replace("-", "")
CLEARING = function(afuID=NLB3_AFU_ID, image="intel/nlb3.gbs",
                    clearOnUnprepare={"afuID": NLB0_AFU_ID, "image": "intel/nlb0.gbs"})

KILL_AFTER_UNRECORDING = textwrap.dedent('''
    """Test-only: ``serve`` kills itself right after an unprepare removed its claims from
    the checkpoint (when the file named by KILL_AFTER_UNRECORDING exists)."""
    import os
    import signal
    import sys

    if "plugin" in sys.orig_argv and "serve" in sys.orig_argv:
        sys.path.insert(0, os.getcwd())  # this tree's plugin, as ``-m plugin`` runs it
        from plugin.serving.dra import prepare

        _remove_specs = prepare.ClaimPreparer._remove_specs

        async def _killed_first(self, claims):
            if os.path.exists(os.environ["KILL_AFTER_UNRECORDING"]):
                os.kill(os.getpid(), signal.SIGKILL)
            return await _remove_specs(self, claims)

        prepare.ClaimPreparer._remove_specs = _killed_first
''')


@pytest.fixture
async def killable(tmp_path: Path, sockdir: Path, logdir: Path,
                   monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[World, Path]]:
    trigger = tmp_path / "kill-now"
    monkeypatch.setenv("KILL_AFTER_UNRECORDING", str(trigger))
    run_at_start_up(KILL_AFTER_UNRECORDING, tmp_path / "inject", monkeypatch)
    async for world in running(tmp_path, sockdir, logdir):
        write_image(world.library, "intel/nlb0.gbs", build_gbs(
            afu_ids=(NLB0_AFU_ID,), interface_id=dashed(DEFAULT_INTERFACE_ID)))
        yield world, trigger


async def test_a_clear_cut_off_by_a_kill_runs_before_the_next_claim_gets_the_port(
        killable: tuple[World, Path], sockdir: Path) -> None:
    world, trigger = killable
    first = world.claim("first", DFL_PORT, CLEARING)
    result = await world.prepare(first)
    assert result.ok, result.error
    await until(lambda: world.published()[DFL_PORT]["afuID"] == NLB3, "nlb3 loaded")

    trigger.touch()
    assert world.kubelet.dra is not None
    await world.kubelet.dra.unprepare([first])  # the driver dies answering it
    await until(lambda: not world.plugin.alive, "the driver killed")
    # Killed exactly there: the claim is no longer recorded, and its clear never ran.
    assert first.uid not in recorded_claims(sockdir / "state")
    assert len(world.tools.invocations("fpgaconf")) == 1
    assert _afu_id(world) == NLB3

    trigger.unlink()
    world.plugin = world.restart("plugin-again")
    await world.plugin.wait_for_log(lambda e: "(claim services" in e.get("message", ""),
                                    what="the restarted driver serving", timeout=15.0)
    dra = world.kubelet.dra
    await dra.wait_until(lambda: dra.endpoints(DRIVER), 15.0, "registered again")
    # The next tenant, naming no function, placed on the port at once (the scheduler still
    # sees the old slice): it is never answered before the clear has run.
    refusals = await _prepared_at_last(world, world.claim("second", DFL_PORT))
    assert _afu_id(world) == NLB0, "the next claim got the previous tenant's function"
    assert len(world.tools.invocations("fpgaconf")) == 2
    assert all("still being cleared" in error for error in refusals), refusals
    text = world.plugin.text()
    assert "was cut off" in text and "clearing after claim" in text


async def _prepared_at_last(world: World, claim: ClaimRef) -> list[str]:
    """Prepare ``claim`` as the kubelet does, calling again while the driver answers an
    error (for at most 30 s); the errors it answered meanwhile."""
    assert world.kubelet.dra is not None
    refusals: list[str] = []
    for _ in range(600):
        outcome = await world.kubelet.dra.prepare([claim])
        if outcome.results and outcome.results[0].ok:
            return refusals
        if outcome.results and outcome.results[0].answered:
            refusals.append(outcome.results[0].error)
        assert world.plugin.alive
        await asyncio.sleep(0.05)
    raise AssertionError(f"never prepared: {refusals[-1:]}")


def _afu_id(world: World) -> str:
    """What the port holds now, as its sysfs says (not the slice, which lags)."""
    return (world.node.port_path("dfl-port.0") / "afu_id").read_text().strip()


async def test_a_clear_cut_off_by_the_loader_dying_quarantines_the_port(
        tmp_path: Path, sockdir: Path, logdir: Path) -> None:
    """The loader split (``--loader-socket``): the loader process killed while it runs a
    clear leaves the card's state unknown, so the port is quarantined, and the clear's
    outcome is known (failed): it is not pending any more."""
    socket = sockdir / "loader" / "l.sock"
    async with world_with(tmp_path, sockdir, logdir, socket, True) as (world, loader):
        assert loader is not None
        await _clear_begun(world, tmp_path, 6.0)
        loader.stop()  # SIGKILL, mid-clear
        await until(lambda: world.published()[DFL_PORT]["taints"],
                    "the port tainted: what it holds is unknown")
        assert world.plugin.alive
        pending = json.loads((sockdir / "state" / "pending-clears.json").read_text())
        assert pending == {"clears": {}}


@pytest.fixture
async def plain(tmp_path: Path, sockdir: Path, logdir: Path) -> AsyncIterator[World]:
    async for world in running(tmp_path, sockdir, logdir):
        yield world


async def test_a_driver_killed_in_the_middle_of_a_clear_runs_it_again_before_the_next_claim(
        plain: World, tmp_path: Path, sockdir: Path) -> None:
    """``serve`` with its loaders in-process, killed (SIGKILL) while the clear's tool is
    writing the card: the clear stays pending and the card's intent record stays, so the
    restarted driver neither offers the port as it is nor lets a claim have it before the
    clear has run again to its end."""
    world = plain
    await _clear_begun(world, tmp_path, 4.0)
    world.plugin.kill()  # SIGKILL, mid-clear
    pending = json.loads((sockdir / "state" / "pending-clears.json").read_text())
    assert len(pending["clears"]) == 1, pending  # not over: still to be done

    world.plugin = world.restart("plugin-again")
    dra = world.kubelet.dra
    await dra.wait_until(lambda: dra.endpoints(DRIVER), 15.0, "registered again")
    refusals = await _prepared_at_last(world, world.claim("second", DFL_PORT))
    assert refusals, "the port was handed out before its clear ran again"
    assert _afu_id(world) == NLB0, "the next claim got the previous tenant's function"
    # The load, the clear cut off by the kill, and the clear run again to its end.
    assert len(world.tools.invocations("fpgaconf")) == 3
    assert json.loads((sockdir / "state" / "pending-clears.json").read_text()) == \
        {"clears": {}}
    await until(lambda: not world.published()[DFL_PORT]["taints"],
                "the port offered again, its state known")


async def _clear_begun(world: World, tmp_path: Path, delay: float) -> None:
    """A claim given nlb3 and then unprepared, its clear to nlb0 begun with tools that take
    ``delay`` seconds: the moment a crash would cut the clear off."""
    write_image(world.library, "intel/nlb0.gbs", build_gbs(
        afu_ids=(NLB0_AFU_ID,), interface_id=dashed(DEFAULT_INTERFACE_ID)))
    first = world.claim("first", DFL_PORT, CLEARING)
    result = await world.prepare(first)
    assert result.ok, result.error
    write_stand_in_tools(tmp_path / "tools", world.node, delay=delay)  # a slow clear
    assert world.kubelet.dra is not None
    assert (await world.kubelet.dra.unprepare([first])).ok
    await until(lambda: len(world.tools.invocations("fpgaconf")) == 2, "the clear begun")
