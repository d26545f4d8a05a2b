"""Pods sharing one card, end to end: the real ``serve``, the emulated 1.36 scheduler and kubelet.

``serve --dra-share alveo=4`` publishes a card holding an xclbin shared four ways (publishing
itself is :mod:`compat_tests.test_dra_share_serve`'s); here claims of DeviceClasses are
allocated by the emulated scheduler (:func:`~compat_tests.apiserver.allocate.allocate_claim`,
``shareID`` and ``consumedCapacity`` as KEP-5075 has the scheduler write them, every write
validated by the API server emulator, of 1.36 unless a test says otherwise) and prepared
through the emulated 1.36 kubelet's v1 DRA client, as a pod's would be: what each container
gets, what each claim's status says, what the scheduler and the driver refuse, and what
outlives a claim or the process. The rules themselves are
:mod:`compat_tests.test_dra_shares`'s, in-process; these check that the daemon wires them to
what a cluster sees. The node and vendor-tool stand-ins are those of
:mod:`compat_tests.test_dra_programming_serve`; a real runtime (podman) applying two shares'
CDI devices is :mod:`compat_tests.test_cdi_runtime`'s.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from compat_tests.apiserver import ApiServerEmulator
from compat_tests.apiserver.allocate import AllocationError, allocate_claim
from compat_tests.dra_support import until
from compat_tests.fake_alveo import DEFAULT_INTERFACE_UUID as ALVEO_INTERFACE
from compat_tests.fake_alveo import load_xclbin, trip_firewall
from compat_tests.fpga_images import XCLBIN_UUID, XclbinSpec, build_xclbin, write_image
from compat_tests.kubelet.dra_results import ClaimRef
from compat_tests.test_dra_programming_serve import DRIVER, NAMESPACE, NODE, World, running
from compat_tests.test_dra_share_serve import shared, slices_valid
from plugin.programming.ids import dashed
from tests.cdi_conformance import check

CARD = "pci-0000-af-00-1"
CARD_BDF = "0000:af:00.1"
OTHER_UUID = "0b6f3c1e-7d2a-4e59-8c41-2f9a6d3e5b70"
CLEAR_UUID = "9a1c2e3f-4b5d-4c6e-8f70-1a2b3c4d5e6f"
SHARED = "app-shared.accelerator.b-com.com"


def xclbin_function(uuid: str, image: str, **more: Any) -> dict[str, Any]:
    return {"opaque": {"driver": DRIVER, "parameters": {
        "apiVersion": f"{DRIVER}/v1alpha1", "kind": "FpgaFunction", "xclbinUUID": uuid,
        "image": image, **more}}}


def share_class(world: World, name: str, uuid: str | None,
                *config: dict[str, Any]) -> None:
    """A class for shares, as deploy/examples/sharing's: this driver's Alveo cards published
    shared, holding xclbin ``uuid`` (None: any)."""
    attributes = f'device.attributes["{DRIVER}"]'
    selectors = [f'device.driver == "{DRIVER}"', "device.allowMultipleAllocations == true",
                 f'{attributes}.family == "alveo"']
    if uuid is not None:
        selectors.append(f'"xclbinUUID" in {attributes} && {attributes}.xclbinUUID == '
                         f'"{uuid}"')
    world.api.create({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                      "metadata": {"name": name},
                      "spec": {"selectors": [{"cel": {"expression": e}} for e in selectors],
                               "config": list(config)}})



async def card_shared(tmp_path: Path, sockdir: Path, logdir: Path) -> AsyncIterator[World]:
    """``serve`` sharing Alveo cards four ways, the card holding app.xclbin published shared
    and :data:`SHARED` the class of its shares."""
    async for world in running(tmp_path, sockdir, logdir, "--dra-share", "alveo=4",
                               "--rescan-interval", "0.2"):
        load_xclbin(world.node, CARD_BDF, XCLBIN_UUID)
        await until(lambda w=world: shared(w, CARD) == 4, "the card published shared")
        share_class(world, SHARED, XCLBIN_UUID)
        yield world

def share(world: World, name: str, contexts: int, device_class: str = SHARED) -> ClaimRef:
    """A claim asking ``contexts`` of a device of ``device_class``, allocated by the
    emulated scheduler (:class:`AllocationError` when it cannot be)."""
    created = world.api.create({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [{"name": "fpga", "exactly": {
            "deviceClassName": device_class,
            "capacity": {"requests": {"contexts": str(contexts)}}}}]}}})
    allocate_claim(world.api, NAMESPACE, name, NODE)
    return ClaimRef(NAMESPACE, name, created["metadata"]["uid"], (DRIVER,))


def result_of(world: World, ref: ClaimRef) -> dict[str, Any]:
    claim = world.api.get("resourceclaims", ref.name, NAMESPACE)
    [result] = claim["status"]["allocation"]["devices"]["results"]
    return result


def entries(world: World, ref: ClaimRef) -> list[dict[str, Any]]:
    claim = world.api.get("resourceclaims", ref.name, NAMESPACE) or {}
    return list(claim.get("status", {}).get("devices", []))


def ready(entry: dict[str, Any]) -> tuple[str, str]:
    condition = next(c for c in entry["conditions"] if c["type"] == "Ready")
    return condition["status"], condition["reason"]


def container_env(cdi: Path, ids: tuple[str, ...]) -> dict[str, str]:
    """The environment a runtime gives a container started with CDI devices ``ids``: each
    ID resolved to the one device of a spec on disk it names (each spec one a runtime's CDI
    library accepts), their ``env`` edits merged in order."""
    specs = [json.loads(p.read_text()) for p in sorted(cdi.glob("*.json"))]
    for spec in specs:
        check(spec)
    env: dict[str, str] = {}
    for cdi_id in ids:
        [edits] = [d.get("containerEdits", {}) for s in specs for d in s["devices"]
                   if f"{s['kind']}={d['name']}" == cdi_id]
        env.update(e.split("=", 1) for e in edits.get("env", []))
    return env


async def prepared(world: World, ref: ClaimRef) -> Any:
    assert world.kubelet.dra is not None
    outcome = await world.kubelet.dra.prepare([ref])
    result = outcome.result(ref.uid)
    assert result.ok, result.error
    return outcome


async def unprepare(world: World, ref: ClaimRef) -> None:
    assert world.kubelet.dra is not None
    outcome = await world.kubelet.dra.unprepare([ref])
    assert outcome.ok, outcome.error


@pytest.fixture
async def card(tmp_path: Path, sockdir: Path, logdir: Path) -> AsyncIterator[World]:
    """Every Alveo card shared four ways once it holds an xclbin; one card holds app.xclbin
    (loaded by an admin's xbutil, seen at the next rescan), the other nothing."""
    async for world in running(tmp_path, sockdir, logdir, "--dra-share", "alveo=4",
                               "--rescan-interval", "0.2"):
        for name, uuid in (("alveo/other.xclbin", OTHER_UUID),
                           ("alveo/clear.xclbin", CLEAR_UUID)):
            write_image(world.library, name, build_xclbin(XclbinSpec(
                uuid=uuid, interface_uuid=dashed(ALVEO_INTERFACE))))
        load_xclbin(world.node, CARD_BDF, XCLBIN_UUID)
        await until(lambda w=world: shared(w, CARD) == 4, "the card published shared")
        share_class(world, SHARED, XCLBIN_UUID)
        yield world


async def test_three_pods_share_a_card_each_with_its_own_share_and_a_fourth_waits(
        card: World, tmp_path: Path) -> None:
    world = card
    refs = [share(world, f"pod-{i}", n) for i, n in enumerate((1, 1, 2))]
    results = [result_of(world, ref) for ref in refs]
    assert {r["device"] for r in results} == {CARD}
    assert [r["consumedCapacity"] for r in results] == [
        {"contexts": "1"}, {"contexts": "1"}, {"contexts": "2"}]
    assert len({r["shareID"] for r in results}) == 3
    # The card's four contexts are taken: the scheduler has no device for a fourth pod.
    with pytest.raises(AllocationError, match=r"cannot allocate all claims.*contexts: 1"):
        share(world, "pod-3", 1)

    envs = []
    for ref, result in zip(refs, results, strict=True):
        outcome = await prepared(world, ref)
        [device] = outcome.result(ref.uid).devices
        # The v1 answer names the share (Device.share_id, kubelets 1.35+).
        assert (device.device_name, device.share_id) == (CARD, result["shareID"])
        envs.append(container_env(tmp_path / "cdi", outcome.cdi_ids(ref.uid)))
    for env, result in zip(envs, results, strict=True):
        assert env["ACCELERATOR_DEVICES"] == CARD_BDF
        assert (env["ACCELERATOR_SHARE_ID"], env["ACCELERATOR_SHARE_CONTEXTS"]) == (
            result["shareID"], result["consumedCapacity"]["contexts"])

    await until(lambda: all(entries(world, r) for r in refs), "each claim's device status")
    for ref, result in zip(refs, results, strict=True):
        [entry] = entries(world, ref)
        assert (entry["device"], entry["shareID"]) == (CARD, result["shareID"])
        assert ready(entry) == ("True", "Prepared")
    assert shared(world, CARD) == 4, "still published shared under its shares"
    assert slices_valid(world)
    assert world.plugin.alive


async def test_a_claim_for_another_function_is_refused_naming_both_and_nothing_is_loaded(
        card: World) -> None:
    world = card
    share_class(world, "other.accelerator.b-com.com", None,
                xclbin_function(OTHER_UUID, "alveo/other.xclbin"))
    held = share(world, "held", 2)
    await prepared(world, held)
    ref = share(world, "other", 1, "other.accelerator.b-com.com")
    assert result_of(world, ref)["device"] == CARD, "the scheduler gave it a share"
    assert world.kubelet.dra is not None
    error = (await world.kubelet.dra.prepare([ref])).result(ref.uid).error
    assert f"the device holds xclbinUUID {XCLBIN_UUID} and the claim's function is " \
        f"xclbinUUID {OTHER_UUID}" in error, error
    assert "nothing was loaded" in error
    assert world.tools.invocations() == []
    assert world.published()[CARD]["xclbinUUID"] == XCLBIN_UUID
    # The share already there is untouched, and the refused claim's contexts are not held.
    assert (await world.kubelet.dra.prepare([held])).result(held.uid).ok
    assert world.plugin.alive


async def test_the_card_going_unhealthy_fails_every_shares_status(card: World) -> None:
    world = card
    refs = [share(world, f"pod-{i}", 1) for i in range(3)]
    for ref in refs:
        await prepared(world, ref)
    await until(lambda: all(entries(world, r) and ready(entries(world, r)[0])[0] == "True"
                            for r in refs), "every share Ready")
    trip_firewall(world.node, CARD_BDF)
    await until(lambda: all(ready(entries(world, r)[0])[0] == "False" for r in refs),
                "every share's entry failed with its card")
    for ref in refs:
        [entry] = entries(world, ref)
        assert entry["shareID"] == result_of(world, ref)["shareID"]
        assert ready(entry) == ("False", "DeviceUnhealthy")
    assert shared(world, CARD) == 4, "still shared: health is published as for any device"
    # Tainted in its slice: the scheduler gives its last context to no new pod.
    await until(lambda: world.published()[CARD]["taints"], "the card tainted")
    with pytest.raises(AllocationError, match="free, untainted and selected"):
        share(world, "late", 1)


async def test_only_the_last_share_to_go_clears_the_card(card: World) -> None:
    world = card
    share_class(world, "clearing.accelerator.b-com.com", XCLBIN_UUID, xclbin_function(
        XCLBIN_UUID, "alveo/app.xclbin", clearOnUnprepare={
            "xclbinUUID": CLEAR_UUID, "image": "alveo/clear.xclbin"}))
    refs = [share(world, f"pod-{i}", 1, "clearing.accelerator.b-com.com") for i in range(3)]
    for ref in refs:
        await prepared(world, ref)
    assert world.tools.invocations() == [], "the card holds the function: nothing loaded"
    for ref in refs[:2]:
        await unprepare(world, ref)
    await asyncio.sleep(1.0)  # a clear started would have run by now
    assert world.tools.invocations() == [], "cleared under a share still running"
    assert world.published()[CARD]["xclbinUUID"] == XCLBIN_UUID

    await unprepare(world, refs[2])
    await until(lambda: world.published()[CARD].get("xclbinUUID") == CLEAR_UUID,
                "the card cleared once its last share is gone")
    [argv] = world.tools.invocations("xbutil")
    assert argv[:3] == ["program", "--device", CARD_BDF], argv
    assert shared(world, CARD) == 4, "holding the clear xclbin, shared again"


@pytest.fixture
async def slow_clear(tmp_path: Path, sockdir: Path, logdir: Path) -> AsyncIterator[World]:
    """The shared card, with vendor tools that take 3 s per load."""
    async for world in running(tmp_path, sockdir, logdir, "--dra-share", "alveo=4",
                               "--rescan-interval", "0.2", delay=3.0):
        write_image(world.library, "alveo/clear.xclbin", build_xclbin(XclbinSpec(
            uuid=CLEAR_UUID, interface_uuid=dashed(ALVEO_INTERFACE))))
        load_xclbin(world.node, CARD_BDF, XCLBIN_UUID)
        await until(lambda w=world: shared(w, CARD) == 4, "the card published shared")
        yield world


async def test_a_share_allocated_while_its_card_is_cleared_is_refused_naming_both(
        slow_clear: World) -> None:
    """While the clear runs the card is published draining (no new share lands:
    :mod:`compat_tests.test_dra_shares_draining`), but a scheduler whose view of the slice
    lags may have given a share of it just before; prepare waits for the clear, then finds
    the function gone."""
    world = slow_clear
    clearing = "clearing.accelerator.b-com.com"
    share_class(world, clearing, XCLBIN_UUID, xclbin_function(
        XCLBIN_UUID, "alveo/app.xclbin", clearOnUnprepare={
            "xclbinUUID": CLEAR_UUID, "image": "alveo/clear.xclbin"}))
    last = share(world, "last", 1, clearing)
    await prepared(world, last)
    late = share(world, "late", 1, clearing)  # from the slice as it was before the clear
    await unprepare(world, last)
    world.api.delete("resourceclaims", "last", NAMESPACE)
    await until(lambda: world.tools.invocations("xbutil"), "the clear started")
    assert world.published()[CARD]["xclbinUUID"] == XCLBIN_UUID, "still published so"
    assert world.kubelet.dra is not None
    error = (await world.kubelet.dra.prepare([late])).result(late.uid).error
    assert f"the device holds xclbinUUID {CLEAR_UUID} and the claim's function is " \
        f"xclbinUUID {XCLBIN_UUID}" in error, error
    assert len(world.tools.invocations("xbutil")) == 1, "the clear only"


async def test_a_share_whose_claim_was_deleted_frees_its_contexts_once_unprepared(
        card: World) -> None:
    world = card
    gone, kept = share(world, "gone", 2), share(world, "kept", 2)
    for ref in (gone, kept):
        await prepared(world, ref)
    world.api.delete("resourceclaims", "gone", NAMESPACE)
    # The scheduler counts only the claims it sees: the contexts are allocated again at once.
    late = share(world, "late", 2)
    assert result_of(world, late)["device"] == CARD
    assert world.kubelet.dra is not None
    error = (await world.kubelet.dra.prepare([late])).result(late.uid).error
    assert "the claim asks 2 context(s) and other shares hold 4" in error, error
    # The kubelet unprepares the pod's claim from what it recorded; the driver from its own.
    await unprepare(world, gone)
    await prepared(world, late)
    assert shared(world, CARD) == 4


async def test_a_restarted_serve_answers_the_same_shares_and_keeps_the_card_shared(
        card: World) -> None:
    world = card
    refs = [share(world, "pod-0", 1), share(world, "pod-1", 2)]
    first = [(await prepared(world, ref)).result(ref.uid).devices for ref in refs]
    await until(lambda: all(entries(world, r) for r in refs), "each share's status")
    world.plugin.kill()
    world.api.clear_requests()
    for obj in world.api.list("resourceslices"):
        world.api.delete("resourceslices", obj["metadata"]["name"])
    world.plugin = world.restart("plugin-again")
    await until(lambda: any(d["name"] == CARD for s in world.api.list("resourceslices")
                            for d in s["spec"].get("devices", [])), "published again", 15.0)
    assert shared(world, CARD) == 4, "shared from the first publication of the new process"
    # The new process writes the status of the claims it holds again (server-side apply:
    # what it leaves out goes): each share's entry is still its own.
    await until(lambda: {r.name for r in world.api.find_requests(verb="patch", status=200)
                         if r.subresource == "status"} >= {"pod-0", "pod-1"},
                "the status written again by the restarted serve", 15.0)
    for ref in refs:
        [entry] = entries(world, ref)
        assert entry["shareID"] == result_of(world, ref)["shareID"]
    assert world.kubelet.dra is not None
    for ref, devices in zip(refs, first, strict=True):
        # A kubelet that lost its own record of the claim (what it cached is answered from
        # its cache, never sent) calls the driver again, until the new process answers.
        world.kubelet.dra.config.checkpoint.claims.pop((NAMESPACE, ref.name))
        for _ in range(100):
            outcome = await world.kubelet.dra.prepare([ref])
            if outcome.ok:
                break
            world.kubelet.dra.config.checkpoint.claims.pop((NAMESPACE, ref.name), None)
            await asyncio.sleep(0.1)
        assert outcome.result(ref.uid).devices == devices, "the same share, the same devices"
    # What the recorded shares hold is still held: one context left.
    one = share(world, "pod-2", 1)
    await prepared(world, one)
    with pytest.raises(AllocationError):
        share(world, "pod-3", 1)


@pytest.mark.parametrize(("served", "version"), [
    ("resource.k8s.io/v1=false,resource.k8s.io/v1beta2=true", "v1beta2"),
    ("resource.k8s.io/v1=false,resource.k8s.io/v1beta2=false,resource.k8s.io/v1beta1=true",
     "v1beta1"),
])
async def test_shares_through_the_beta_apis_of_a_1_34_cluster_with_the_gate_on(
        tmp_path: Path, sockdir: Path, logdir: Path, served: str, version: str) -> None:
    """1.34 and 1.35 have DRAConsumableCapacity off by default (alpha); with it on, a
    cluster serving resource.k8s.io only as v1beta2 (or v1beta1, the fields under
    ``basic``) gets the same shares: the slice written, the claims' ``shareID`` read, each
    share's status entry written, all in that version."""
    def api_server() -> ApiServerEmulator:
        return ApiServerEmulator("1.34", feature_gates={"DRAConsumableCapacity": True},
                                 runtime_config=served)

    async for world in running(tmp_path, sockdir, logdir, "--dra-share", "alveo=4",
                               "--rescan-interval", "0.2", api_server=api_server):
        await _two_shares(world, tmp_path / "cdi")
        writes = {(r.resource, r.version) for r in world.api.find_requests(status=200)
                  if r.verb in ("create", "update", "patch", "apply")
                  and r.resource.startswith("resource")}
        assert writes == {("resourceslices", version), ("resourceclaims", version)}, writes


async def _two_shares(world: World, cdi: Path) -> None:
    load_xclbin(world.node, CARD_BDF, XCLBIN_UUID)
    await until(lambda: shared(world, CARD) == 4, "the card published shared")
    share_class(world, SHARED, XCLBIN_UUID)
    refs = [share(world, f"pod-{i}", n) for i, n in enumerate((1, 3))]
    with pytest.raises(AllocationError):
        share(world, "pod-2", 1)
    for ref in refs:
        outcome = await prepared(world, ref)
        [device] = outcome.result(ref.uid).devices
        assert device.share_id == result_of(world, ref)["shareID"]
        env = container_env(cdi, outcome.cdi_ids(ref.uid))
        assert env["ACCELERATOR_SHARE_ID"] == device.share_id
    await until(lambda: all(entries(world, r) for r in refs), "each share's status")
    assert [entries(world, r)[0]["shareID"] for r in refs] == [
        result_of(world, r)["shareID"] for r in refs]
