"""NodePrepareResources calls for one claim that overlap, against the real ``serve``.

The 1.36 kubelet calls NodePrepareResources outside its claim-cache lock
(``pkg/kubelet/cm/dra/manager.go`` prepareResources): two pods sharing one claim send it at
once (the emulated kubelet does the same when two of its pods' prepares run at once), and a
call repeated after its deadline overlaps the first. What a kubelet and a user see: every
call gets the same answer; the claim is read once and its function loaded once; no card
ever holds more contexts than it has, nor a whole claim and a share together; an unprepare
sent while the claim is being prepared leaves neither a record nor a spec behind. The world
(emulated 1.36 API server and kubelet, fake node, vendor-tool stand-ins whose loads can be
slowed down) is :mod:`compat_tests.test_dra_programming_serve`'s; shares are allocated as in
:mod:`compat_tests.test_dra_shares_e2e`. Calls with deadlines of their own go to the
driver's socket directly, through the emulated kubelet's own gRPC client.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from compat_tests.apiserver import objects
from compat_tests.dra_support import recorded_claims, until
from compat_tests.fake_alveo import DEFAULT_INTERFACE_UUID as ALVEO_INTERFACE
from compat_tests.fake_alveo import load_xclbin
from compat_tests.fpga_images import (
    NLB3_AFU_ID,
    XCLBIN_UUID,
    XclbinSpec,
    build_xclbin,
    write_image,
)
from compat_tests.kubelet.dra_plugin import DraPluginClient
from compat_tests.kubelet.dra_results import ClaimRef
from compat_tests.test_dra_programming_serve import (
    DFL_BDF,
    DFL_PORT,
    DRIVER,
    NAMESPACE,
    NLB3,
    NODE,
    World,
    function,
    running,
)
from compat_tests.test_dra_share_serve import shared
from compat_tests.test_dra_shares_e2e import (
    CARD,
    CARD_BDF,
    CLEAR_UUID,
    card_shared,
    result_of,
    share,
    share_class,
    xclbin_function,
)
from plugin.programming.ids import dashed

NLB3_FUNCTION = function(afuID=NLB3_AFU_ID, image="intel/nlb3.gbs")


def reads(world: World, ref: ClaimRef) -> int:
    """How many times the driver read the claim from the API server."""
    return len([r for r in world.api.find_requests(verb="get", resource="resourceclaims")
                if r.name == ref.name])


@contextlib.asynccontextmanager
async def socket(world: World, timeout: float) -> AsyncIterator[DraPluginClient]:
    """A gRPC client of the driver's socket, as the kubelet's, whose calls have ``timeout``."""
    dra = world.kubelet.dra
    assert dra is not None
    service = dra.service(DRIVER)
    assert service is not None
    client = DraPluginClient(dra.model, DRIVER, dra.endpoints(DRIVER)[-1], service, timeout)
    try:
        yield client
    finally:
        await client.close()


async def call(client: DraPluginClient, method: str, ref: ClaimRef) -> tuple[str, Any]:
    """``(error, devices)`` of one claim's entry in the driver's answer."""
    response, record = await client.call(method, [ref])
    assert response is not None, record.error
    entry = response.claims[ref.uid]
    return entry.error, client.devices(entry) if method == "NodePrepareResources" else ()


def contexts_on(state: Path, device: str) -> tuple[int, bool]:
    """``(contexts recorded shares hold on device, whether a claim holds it whole)``."""
    held = [d for c in recorded_claims(state).values() for d in c.devices if d.device == device]
    return sum(d.contexts or 0 for d in held if d.share_id), any(not d.share_id for d in held)


async def twice_at_once(world: World, ref: ClaimRef) -> list[Any]:
    """Two pods' prepares of one claim at once, through the emulated kubelet."""
    assert world.kubelet.dra is not None
    outcomes = await asyncio.gather(world.kubelet.dra.prepare([ref]),
                                    world.kubelet.dra.prepare([ref]))
    return [o.result(ref.uid) for o in outcomes]


@pytest.fixture
async def card(tmp_path: Path, sockdir: Path, logdir: Path) -> AsyncIterator[World]:
    """An Alveo card holding app.xclbin, published shared four ways; claim reads take 1 s."""
    async for world in card_shared(tmp_path, sockdir, logdir):
        world.api.faults.slow_down("get", "resourceclaims", 1.0)
        yield world


async def test_two_pods_calls_for_one_share_at_once_get_one_answer(card: World,
                                                                    sockdir: Path) -> None:
    world = card
    ref = share(world, "pod", 2)
    answers = await twice_at_once(world, ref)
    assert all(a.ok for a in answers), [a.error for a in answers]
    assert answers[0].devices == answers[1].devices
    assert answers[0].devices[0].share_id == result_of(world, ref)["shareID"]
    assert reads(world, ref) == 1, "read and let in once for both calls"
    assert list(recorded_claims(sockdir / "state")) == [ref.uid]
    assert contexts_on(sockdir / "state", CARD) == (2, False)


async def test_two_pods_calls_for_one_whole_claim_at_once_get_one_answer(
        tmp_path: Path, sockdir: Path, logdir: Path) -> None:
    async for world in running(tmp_path, sockdir, logdir):
        world.api.faults.slow_down("get", "resourceclaims", 1.0)
        ref = world.claim("plain", DFL_PORT)
        answers = await twice_at_once(world, ref)
        assert all(a.ok for a in answers), [a.error for a in answers]
        assert answers[0].devices == answers[1].devices
        assert reads(world, ref) == 1
        assert list(recorded_claims(sockdir / "state")) == [ref.uid]


@pytest.fixture
async def slow(tmp_path: Path, sockdir: Path, logdir: Path) -> AsyncIterator[World]:
    """Loads that take 3 s; the emulated kubelet's calls have 10 s."""
    async for world in running(tmp_path, sockdir, logdir, delay=3.0, call_timeout=10.0):
        yield world


async def test_two_calls_for_a_claim_being_loaded_wait_for_one_load(slow: World) -> None:
    world = slow
    ref = world.claim("nlb3", DFL_PORT, NLB3_FUNCTION)
    answers = await twice_at_once(world, ref)
    assert all(a.ok for a in answers), [a.error for a in answers]
    assert answers[0].devices == answers[1].devices
    assert len(world.tools.invocations("fpgaconf")) == 1, "loaded once"
    assert reads(world, ref) == 1


async def test_a_call_repeated_after_the_first_ones_deadline_gets_the_load_it_started(
        slow: World) -> None:
    """The first call (a 2 s deadline) is answered while the load still runs; the kubelet's
    next call, sent while the first is still being answered, waits for that same load."""
    world = slow
    ref = world.claim("nlb3", DFL_PORT, NLB3_FUNCTION)
    async with socket(world, 2.0) as hurried, socket(world, 10.0) as patient:
        first = asyncio.create_task(call(hurried, "NodePrepareResources", ref))
        await until(lambda: world.tools.invocations("fpgaconf"), "the load started")
        second = asyncio.create_task(call(patient, "NodePrepareResources", ref))
        error, _ = await first
        assert f"still loading afuID {NLB3_AFU_ID} onto {DFL_BDF}" in error, error
        assert not second.done()
        error, devices = await second
    assert not error, error
    assert [d.device_name for d in devices] == [DFL_PORT]
    assert len(world.tools.invocations("fpgaconf")) == 1, "loaded once"
    assert reads(world, ref) == 1
    await until(lambda: world.published()[DFL_PORT]["afuID"] == NLB3, "published loaded")
    assert not world.published()[DFL_PORT]["taints"]


async def test_an_unprepare_sent_while_the_claim_is_loaded_leaves_nothing_behind(
        slow: World, sockdir: Path, tmp_path: Path) -> None:
    """The unprepare waits for the prepare under way, then undoes it: no record, no spec,
    nothing the kubelet (which has forgotten the claim) would never unprepare."""
    world = slow
    ref = world.claim("nlb3", DFL_PORT, NLB3_FUNCTION)
    assert world.kubelet.dra is not None
    prepare = asyncio.create_task(world.kubelet.dra.prepare([ref]))
    await until(lambda: world.tools.invocations("fpgaconf"), "the load started")
    unprepared = await world.kubelet.dra.unprepare([ref])
    assert unprepared.ok, unprepared.error
    assert prepare.done(), "the unprepare was answered before the prepare under way"
    assert (await prepare).result(ref.uid).ok
    assert ref.uid not in recorded_claims(sockdir / "state")
    assert not [p for p in (tmp_path / "cdi").glob("*.json") if ref.uid in p.name]


@pytest.fixture
async def failing_clear(tmp_path: Path, sockdir: Path, logdir: Path) -> AsyncIterator[World]:
    """The shared card, with vendor tools whose loads take 4 s and then fail: a clear keeps
    the shares let in meanwhile waiting, and leaves the card holding app.xclbin."""
    async for world in running(tmp_path, sockdir, logdir, "--dra-share", "alveo=4",
                               "--rescan-interval", "0.2", delay=4.0,
                               fail="programming failed"):
        write_image(world.library, "alveo/clear.xclbin", build_xclbin(XclbinSpec(
            uuid=CLEAR_UUID, interface_uuid=dashed(ALVEO_INTERFACE))))
        load_xclbin(world.node, CARD_BDF, XCLBIN_UUID)
        await until(lambda w=world: shared(w, CARD) == 4, "the card published shared")
        yield world


def placed(world: World, name: str, contexts: int | None) -> ClaimRef:
    """A claim given a share of the card (None: all of it) by a scheduler whose view of the
    slice lags (written as it writes it, past the emulated scheduler's own checks)."""
    world.api.create_claim(NAMESPACE, name, [("fpga", DRIVER)])
    extra: dict[str, Any] = {} if contexts is None else {
        "shareID": str(uuid.uuid4()), "consumedCapacity": {"contexts": str(contexts)}}
    obj = world.api.set_claim_status(NAMESPACE, name, {"allocation": objects.allocation(
        [objects.result("fpga", DRIVER, NODE, CARD, **extra)], node_name=NODE)})
    return ClaimRef(NAMESPACE, name, obj["metadata"]["uid"], (DRIVER,))


@pytest.mark.parametrize(("contexts", "refusal"), [
    (3, "more contexts than the device has (4)"),
    (None, "a device has one owner or only shares"),
], ids=["contexts", "whole"])
async def test_a_call_given_up_during_a_clear_keeps_the_share_for_the_call_still_waiting(
        failing_clear: World, sockdir: Path, contexts: int | None, refusal: str) -> None:
    """Share A (2 of 4 contexts) is let in while the card is being cleared; the first call
    for it gives up, a second one still waits; a third claim (3 contexts, or the whole
    card) is prepared meanwhile. The first call must not give A's contexts back: the third
    claim is refused, and the card never holds 5 contexts, or a share and a whole claim."""
    world = failing_clear
    share_class(world, "clearing", XCLBIN_UUID, xclbin_function(
        XCLBIN_UUID, "alveo/app.xclbin", clearOnUnprepare={
            "xclbinUUID": CLEAR_UUID, "image": "alveo/clear.xclbin"}))
    last = share(world, "last", 1, "clearing")
    assert world.kubelet.dra is not None
    assert (await world.kubelet.dra.prepare([last])).ok
    a = share(world, "a", 2, "clearing")
    assert (await world.kubelet.dra.unprepare([last])).ok
    await until(lambda: world.tools.invocations("xbutil"), "the clear started")
    third = placed(world, "third", contexts)
    async with socket(world, 1.0) as hurried, socket(world, 20.0) as patient:
        first = asyncio.create_task(call(hurried, "NodePrepareResources", a))
        second = asyncio.create_task(call(patient, "NodePrepareResources", a))
        error, _ = await first
        assert "could not be prepared within" in error, error
        error, _ = await call(patient, "NodePrepareResources", third)
        assert refusal in error, error
        error, devices = await second
    assert not error, error
    assert [d.share_id for d in devices] == [result_of(world, a)["shareID"]]
    assert contexts_on(sockdir / "state", CARD) == (2, False)
    assert reads(world, a) == 1
