"""``serve --program-at bind``: a driver killed mid-load, and shares, against the real process.

The world of :mod:`compat_tests.test_dra_binding_serve` (the real ``serve``, an emulated 1.36
API server, kubelet and scheduler, the stand-in vendor tools). A driver killed with SIGKILL
while it loads a claim's function before binding leaves an intent record
(:mod:`plugin.programming.card_state`): the process started again must not trust what the
card seems to hold, so the claim waiting on it is either loaded again or failed, never told
``FunctionReady`` on a card whose state is unknown. A share never programs: it is ready only
when its device holds the share's function, otherwise failed naming both.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from compat_tests.apiserver.allocate import allocate_claim
from compat_tests.apiserver.scheduler import BindingScheduler
from compat_tests.dra_support import until
from compat_tests.fake_alveo import DEFAULT_INTERFACE_UUID as ALVEO_INTERFACE
from compat_tests.fake_alveo import load_xclbin
from compat_tests.fpga_images import XCLBIN_UUID, XclbinSpec, build_xclbin, write_image
from compat_tests.test_dra_binding_serve import FAILED, INTEL, READY, conditions, nlb3_class
from compat_tests.test_dra_programming_serve import NAMESPACE, NODE, World, running
from compat_tests.test_dra_share_serve import shared
from compat_tests.test_dra_shares_e2e import (
    CARD,
    CARD_BDF,
    OTHER_UUID,
    SHARED,
    share,
    share_class,
    xclbin_function,
)
from plugin.programming.ids import dashed

SLOW = 4.0
"""Seconds each stand-in load takes: long enough to kill the driver in the middle of one."""
LONGER = ("--program-timeout", "30")


def records(state: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((state / "cards").glob("*.json"))]


@pytest.fixture
async def slow(tmp_path: Path, sockdir: Path, logdir: Path) -> AsyncIterator[World]:
    async for w in running(tmp_path, sockdir, logdir, "--program-at", "bind", *LONGER,
                           delay=SLOW):
        nlb3_class(w.api)
        yield w


@pytest.mark.parametrize("restart", ["at once", "once the orphaned tool wrote the function"])
async def test_a_driver_killed_mid_load_never_says_ready_on_the_card_it_cut_off(
        slow: World, sockdir: Path, restart: str) -> None:
    world = slow
    world.api.create_claim(NAMESPACE, "job", [("fpga", INTEL)])
    stored = allocate_claim(world.api, NAMESPACE, "job", NODE)
    device = stored["status"]["allocation"]["devices"]["results"][0]["device"]
    await until(lambda: world.tools.spans("fpgaconf"), "the load before binding begun")
    assert records(sockdir / "state")[0]["intent"]["device"], "the intent, while it loads"
    world.plugin.kill()  # SIGKILL: the tool goes on, holding the card lock
    if restart != "at once":
        # The orphan ends and writes NLB3: the card now *seems* to hold the claim's function.
        await until(lambda: world.tools.spans("fpgaconf")[0][1] is not None,
                    "the orphaned tool done", 30.0)
    world.plugin = world.restart("plugin-again")
    await until(lambda: conditions(world, "job"), "the claim answered by the new process", 40.0)
    answer = conditions(world, "job")
    assert world.plugin.text().count("state unknown after a load was interrupted") >= 1
    if READY in answer:
        # Ready only after a load of its own, begun once the cut-off one had ended.
        assert answer[READY]["status"] == "True"
        assert answer[READY]["reason"] == "Loaded", answer[READY]
        spans = world.tools.spans("fpgaconf")
        assert len(spans) == 2, spans
        (_, first_end), (second_start, _) = spans
        assert first_end is not None and first_end <= second_start, spans
        await until(lambda: not world.published()[device]["taints"], "known again")
    else:
        assert answer[FAILED]["status"] == "True", answer
        assert world.published()[device]["taints"], "a card of unknown state stays tainted"
    assert world.plugin.alive


@pytest.fixture
async def shared_card(tmp_path: Path, sockdir: Path, logdir: Path) -> AsyncIterator[World]:
    """An Alveo card holding app.xclbin (an admin's xbutil), published shared four ways, with
    ``--program-at bind``; the class of its shares names that xclbin."""
    async for world in running(tmp_path, sockdir, logdir, "--program-at", "bind",
                               "--dra-share", "alveo=4", "--rescan-interval", "0.2"):
        write_image(world.library, "alveo/other.xclbin", build_xclbin(XclbinSpec(
            uuid=OTHER_UUID, interface_uuid=dashed(ALVEO_INTERFACE))))
        load_xclbin(world.node, CARD_BDF, XCLBIN_UUID)
        await until(lambda w=world: shared(w, CARD) == 4, "the card published shared")
        share_class(world, SHARED, XCLBIN_UUID,
                    xclbin_function(XCLBIN_UUID, "alveo/app.xclbin"))
        share_class(world, "other.accelerator.b-com.com", None,
                    xclbin_function(OTHER_UUID, "alveo/other.xclbin"))
        yield world


def entry_of(world: World, claim: str) -> dict[str, Any]:
    obj = world.api.get("resourceclaims", claim, NAMESPACE) or {}
    [entry] = obj.get("status", {}).get("devices", [])
    return entry


async def test_a_share_is_ready_only_when_its_card_holds_its_function(
        shared_card: World) -> None:
    world = shared_card
    # The card is published with the binding conditions: a share's result carries them.
    share(world, "held", 1)
    claim = world.api.get("resourceclaims", "held", NAMESPACE)
    assert claim is not None
    [result] = claim["status"]["allocation"]["devices"]["results"]
    assert result["bindingConditions"] == [READY] and result["shareID"]
    await until(lambda: conditions(world, "held"), "the share answered")
    entry = entry_of(world, "held")
    assert entry["shareID"] == result["shareID"]
    [ready] = entry["conditions"]
    assert (ready["type"], ready["status"], ready["reason"]) == (READY, "True",
                                                                 "AlreadyLoaded")
    # A share of a function the card does not hold: failed, naming both; nothing loaded.
    other = share(world, "other", 1, "other.accelerator.b-com.com")
    await until(lambda: conditions(world, other.name), "the other share answered")
    [failed] = entry_of(world, "other")["conditions"]
    assert (failed["type"], failed["status"]) == (FAILED, "True"), failed
    assert f"the device holds xclbinUUID {XCLBIN_UUID} and the claim's function is " \
        f"xclbinUUID {OTHER_UUID}" in failed["message"], failed
    assert world.tools.invocations() == []
    assert world.published()[CARD]["xclbinUUID"] == XCLBIN_UUID
    assert not world.published()[CARD]["taints"], "a refused share leaves the card healthy"
    assert world.plugin.alive


async def test_the_scheduler_binds_a_share_of_the_held_function_and_drops_the_other(
        shared_card: World) -> None:
    world = shared_card
    scheduler = BindingScheduler(world.api, poll=0.2, binding_timeout=30.0)
    world.api.create({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "wants-other", "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [{"name": "fpga", "exactly": {
            "deviceClassName": "other.accelerator.b-com.com",
            "capacity": {"requests": {"contexts": "1"}}}}]}}})
    outcome = await scheduler.schedule(NAMESPACE, "wants-other-pod", "wants-other", NODE,
                                       attempts=2)
    # Every try lands on the one shared card, and each is failed: the pod never binds there.
    assert not outcome.bound
    assert outcome.devices and set(outcome.devices) == {CARD}
    assert all("binding failed" in e and OTHER_UUID in e for e in outcome.errors), outcome
    assert world.tools.invocations() == []
