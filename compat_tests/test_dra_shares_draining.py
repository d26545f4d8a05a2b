"""A shared card that must take no new share, end to end: the real ``serve``, the emulated
1.36 scheduler and kubelet (the world and helpers of :mod:`compat_tests.test_dra_shares_e2e`).

Two moments when a card published shared must not get another share: while the clear of its
last share runs (the function the classes select by is going), and while shares hold it under
a ``--dra-share`` setting that no longer shares it (turned off at a restart). Each time the
card is published with the in-use taint, value ``draining`` (NoSchedule), so the scheduler
places no new share there; and a share the scheduler placed from the slice as it was before
(its view of slices lags the driver's) is valid only for the function the card held when it
was shared: one prepared once the clear is over is refused naming both, whatever its class
names, and nothing is loaded for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from compat_tests.apiserver.allocate import AllocationError
from compat_tests.dra_support import until
from compat_tests.fake_alveo import DEFAULT_INTERFACE_UUID as ALVEO_INTERFACE
from compat_tests.fake_alveo import load_xclbin
from compat_tests.fpga_images import XCLBIN_UUID, XclbinSpec, build_xclbin, write_image
from compat_tests.test_dra_auto import Scraper
from compat_tests.test_dra_programming_serve import DRIVER, NAMESPACE, World, running
from compat_tests.test_dra_share_serve import shared, slices_valid
from compat_tests.test_dra_shares_e2e import (
    CARD,
    CARD_BDF,
    CLEAR_UUID,
    SHARED,
    card_shared,
    entries,
    prepared,
    share,
    share_class,
    unprepare,
    xclbin_function,
)
from plugin.programming.ids import dashed

DRAINING = {"key": f"{DRIVER}/in-use", "value": "draining", "effect": "NoSchedule"}
CLEARING = "clearing.accelerator.b-com.com"


def taints(world: World) -> list[dict[str, Any]]:
    """The card's taints as published (without the ``timeAdded`` the server adds)."""
    return [{k: v for k, v in t.items() if k != "timeAdded"}
            for t in world.published()[CARD]["taints"]]


@pytest.fixture
async def slow_clear(tmp_path: Path, sockdir: Path, logdir: Path) -> AsyncIterator[World]:
    """The card shared four ways holding app.xclbin, vendor tools taking 3 s per load, a
    class for shares of app.xclbin that names no function (as deploy/examples/sharing's) and
    one that names it and clears the card to clear.xclbin once its last share goes."""
    async for world in running(tmp_path, sockdir, logdir, "--dra-share", "alveo=4",
                               "--rescan-interval", "0.2", "--metrics-port",
                               str(Scraper.free_port()), "--metrics-address", "127.0.0.1",
                               delay=3.0):
        write_image(world.library, "alveo/clear.xclbin", build_xclbin(XclbinSpec(
            uuid=CLEAR_UUID, interface_uuid=dashed(ALVEO_INTERFACE))))
        load_xclbin(world.node, CARD_BDF, XCLBIN_UUID)
        await until(lambda w=world: shared(w, CARD) == 4, "the card published shared")
        share_class(world, SHARED, XCLBIN_UUID)
        share_class(world, CLEARING, XCLBIN_UUID, xclbin_function(
            XCLBIN_UUID, "alveo/app.xclbin", clearOnUnprepare={
                "xclbinUUID": CLEAR_UUID, "image": "alveo/clear.xclbin"}))
        yield world


async def test_a_share_naming_no_function_placed_before_the_clear_is_refused_after_it(
        slow_clear: World) -> None:
    world = slow_clear
    metrics = await Scraper.of(world.plugin)
    last = share(world, "last", 1, CLEARING)
    await prepared(world, last)
    # Placed by a scheduler that saw the card shared, holding app.xclbin (as it may be a
    # moment after the card's last share went, its view of slices lagging the driver's).
    late = share(world, "late", 1)
    await unprepare(world, last)
    await until(lambda: world.tools.invocations("xbutil"), "the clear started")

    # While the clear runs: still shared, still naming app.xclbin, but tainted, so the
    # scheduler places no new share of app.xclbin on a card that is about to lose it.
    await until(lambda: DRAINING in taints(world), "the card published draining")
    assert world.published()[CARD]["xclbinUUID"] == XCLBIN_UUID
    assert shared(world, CARD) == 4
    with pytest.raises(AllocationError, match="free, untainted and selected"):
        share(world, "during", 1)
    assert slices_valid(world), "the 1.36 schemas take the taint"

    assert world.kubelet.dra is not None
    result = (await world.kubelet.dra.prepare([late])).result(late.uid)
    assert not result.ok, "prepared on a card that no longer holds what its class selected"
    assert (f"the device was published shared holding xclbinUUID {XCLBIN_UUID} and holds "
            f"xclbinUUID {CLEAR_UUID} now") in result.error, result.error
    assert "nothing was loaded" in result.error
    assert len(world.tools.invocations("xbutil")) == 1, "the clear only"
    # Said where a user looks: an Event regarding the claim, its status, the metric.
    await until(lambda: world.events("FunctionNotHeld"), "a FunctionNotHeld Event")
    [event] = world.events("FunctionNotHeld")
    assert event["regarding"]["name"] == "late"
    assert f"xclbinUUID {XCLBIN_UUID}" in event["note"], event
    await until(lambda: entries(world, late), "the refusal in the claim's status")
    [entry] = entries(world, late)
    assert entry["data"]["functionOutcome"] == "not_held"
    assert entry["data"]["deviceClass"] == SHARED
    await metrics.until("a share refused for the function it was shared with",
                        **{"dra_programming_total__family=alveo,loader=,result=not_held": 1})

    # The clear over: shared again holding clear.xclbin, untainted, and the class of
    # app.xclbin selects it no more.
    await until(lambda: world.published()[CARD].get("xclbinUUID") == CLEAR_UUID
                and not taints(world), "the card shared again once cleared, untainted")
    assert shared(world, CARD) == 4
    with pytest.raises(AllocationError):
        share(world, "after", 1)
    assert world.plugin.alive


@pytest.fixture
async def card(tmp_path: Path, sockdir: Path, logdir: Path) -> AsyncIterator[World]:
    async for world in card_shared(tmp_path, sockdir, logdir):
        yield world


async def test_shares_under_a_setting_turned_off_take_no_new_one_then_the_card_goes_whole(
        card: World) -> None:
    world = card
    kept = share(world, "kept", 1)
    await prepared(world, kept)
    world.plugin.kill()
    world.plugin = world.restart("plugin-off", "--dra-share", "alveo=off")
    # Re-worked from the setting, never below what the share holds: 2 contexts, one free,
    # but draining, so the scheduler places nothing there.
    await until(lambda: DRAINING in taints(world), "published draining by the new process",
                15.0)
    assert shared(world, CARD) == 2
    assert slices_valid(world)
    with pytest.raises(AllocationError, match="free, untainted and selected"):
        share(world, "new", 1)

    assert world.kubelet.dra is not None
    for _ in range(100):  # until the new process answers the kubelet
        outcome = await world.kubelet.dra.unprepare([kept])
        if outcome.ok:
            break
        await asyncio.sleep(0.1)
    assert outcome.ok, outcome.error
    await until(lambda: shared(world, CARD) == 0 and not taints(world),
                "published whole once its share is gone")
    claim = world.api.get("resourceclaims", "new", NAMESPACE)
    assert "allocation" not in claim.get("status", {})
    assert world.plugin.alive
