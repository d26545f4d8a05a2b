"""Shares of one loaded FPGA (KEP-5075 consumable capacity), prepared by the real driver parts.

The real :class:`ClaimPreparer` with its checkpoint in a real directory, claim CDI specs,
function step (a :class:`Programmer` over a fake DFL card whose loader rewrites the port's
``afu_id``, as ``tests/test_programmer.py`` scripts it) and claim status writer, reading and
writing claims through the driver's own API client against the emulated 1.36 API server,
whose status subresource validates what the scheduler would write (``shareID``,
``consumedCapacity``) and what the driver applies (entries keyed by ``shareID``). Which
devices are published shared is given as the pool would say it (device ID -> contexts).
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest

from api_versions.claim_status import status_apply
from api_versions.k8s_objects import api_version_of
from api_versions.resource_claims import parse_claim
from compat_tests.apiserver import ApiServerEmulator, objects
from compat_tests.fake_sysfs import FakeNode
from compat_tests.fpga_images import (
    NLB0_AFU_ID,
    NLB3_AFU_ID,
    SKX_INTERFACE_ID,
    build_gbs,
    write_image,
)
from plugin.discovery.backends import make_backend
from plugin.programming.image_checks import ImageChecks
from plugin.programming.library import ImageLibrary
from plugin.programming.programmer import Programmer
from plugin.programming.quarantine import Quarantine
from plugin.serving.dra import checkpoint_format
from plugin.serving.dra.apiserver import ApiServer
from plugin.serving.dra.checkpoint import ClaimCheckpoint
from plugin.serving.dra.claim_cdi import ClaimSpecs, accelerator_env
from plugin.serving.dra.claim_status import ClaimStatusReporter
from plugin.serving.dra.function_audit import Auditor
from plugin.serving.dra.prepare import ClaimPreparer
from plugin.serving.dra.shares import SharedAs
from plugin.serving.dra.sharing import CLOSED
from tests.test_programmer import HEX, PORT, PORT1, ScriptedLoader
from value_types.claims import ClaimRef, DeviceStatusReport
from value_types.devices import DeviceSet

DRIVER = "accelerator.b-com.com"
NODE = "node-a"
NAMESPACE = "team"
CLASS = "fpga-shared"
NAMES = {"fpga-0": PORT, "fpga-1": PORT1}
"""DRA device name -> device ID: the two ports of one card."""


def function(afu: str, image: str, clear: tuple[str, str] | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "FpgaFunction",
                              "afuID": afu, "image": image}
    if clear is not None:
        params["clearOnUnprepare"] = {"afuID": clear[0], "image": clear[1]}
    return params


class Node:
    """One node's driver parts, and what outlives a restart (checkpoint, CDI specs, card)."""

    def __init__(self, tmp_path: Path, api: ApiServerEmulator, client: ApiServer) -> None:
        self.api, self.client = api, client
        self.state, self.cdi = tmp_path / "state", tmp_path / "cdi"
        self.card = FakeNode(tmp_path / "sysfs")
        self.card.add_dfl_card(PORT, ports=2, interface_id=SKX_INTERFACE_ID.replace("-", ""),
                               afu_id=HEX[NLB0_AFU_ID])
        self.backend = make_backend("intel", self.card.config())
        images = tmp_path / "images"
        write_image(images, "nlb0.gbs", build_gbs(afu_ids=(NLB0_AFU_ID,)))
        write_image(images, "nlb3.gbs", build_gbs(afu_ids=(NLB3_AFU_ID,)))
        self.loader = ScriptedLoader(self.card, {PORT: self.card.cards[PORT].ports[0],
                                                 PORT1: self.card.cards[PORT].ports[1]})
        self.programmer = Programmer(
            enabled=True, loaders={"intel": self.loader},
            checks=ImageChecks(ImageLibrary(images)), quarantine=Quarantine(self.state),
            devices=self.devices, rescan=self._rescan, driver=DRIVER, timeout=5.0)
        self.programmer.take_ownership()
        self.published: dict[str, int] = {PORT: 4}
        self.shared_as: dict[str, SharedAs] = {}
        """What each device is shared as (the pool's word; empty: not said)."""
        self.events: list[tuple[str, str, str]] = []
        self.status = ClaimStatusReporter(DRIVER, self.devices, self._write_status,
                                          backoff_initial=0.05)
        self.preparer = self.new_preparer()

    def devices(self) -> DeviceSet:
        return DeviceSet.of(self.backend.scan())

    def _rescan(self, _reason: str) -> None:
        asyncio.get_running_loop().call_later(0.02, self.programmer.devices_changed)

    async def _write_status(self, ref: ClaimRef, reports: tuple[DeviceStatusReport, ...]
                            ) -> None:
        await self.client.apply_claim_status(lambda v: status_apply(v, ref, reports),
                                             field_manager=DRIVER)

    async def _read(self, ref: ClaimRef):  # type: ignore[no-untyped-def]
        obj = await self.client.get_claim(ref.namespace, ref.name)
        return parse_claim(api_version_of(obj), obj, DRIVER)

    def _told(self, namespace: str, name: str, uid: str, kind: str, reason: str,
              note: str) -> None:
        self.events.append((name, reason, note))

    def new_preparer(self) -> ClaimPreparer:
        """A driver (re)started over the same checkpoint file."""
        return ClaimPreparer(
            DRIVER, NODE, lambda: NAMES, self._read,
            lambda device_id: [f"b-com.com/accelerator={device_id.replace(':', '-')}"],
            ClaimCheckpoint(self.state / "claims.jsonl"),
            claim_specs=ClaimSpecs(self.cdi, DRIVER,
                                   lambda ids: accelerator_env(ids, self.devices())),
            on_prepared=self.status.prepared, on_unprepared=self.status.unprepared,
            programmer=self.programmer, auditor=Auditor(self._told),
            refused_in_status=self.status.refused,
            published_contexts=lambda: dict(self.published),
            published_shares=lambda: dict(self.shared_as))

    def claim(self, name: str, device: str = "fpga-0", contexts: str | None = "1",
              share: bool = True, config: dict[str, Any] | None = None) -> ClaimRef:
        """A claim of one request allocated one share of ``device`` (or all of it), written
        as the 1.36 scheduler writes it, through the validated status subresource."""
        self.api.namespaces.add(NAMESPACE)
        exactly: dict[str, Any] = {"deviceClassName": CLASS}
        if share and contexts is not None:
            exactly["capacity"] = {"requests": {"contexts": contexts}}
        created = self.api.create({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                                   "metadata": {"name": name, "namespace": NAMESPACE},
                                   "spec": {"devices": {"requests": [
                                       {"name": "fpga", "exactly": exactly}]}}})
        extra: dict[str, Any] = {}
        if share:
            extra["shareID"] = str(uuid.uuid4())
            if contexts is not None:
                extra["consumedCapacity"] = {"contexts": contexts}
        configs = [] if config is None else [{"source": "FromClass", "requests": ["fpga"],
                                              "opaque": {"driver": DRIVER,
                                                         "parameters": config}}]
        self.api.set_claim_status(NAMESPACE, name, {"allocation": objects.allocation(
            [objects.result("fpga", DRIVER, NODE, device, **extra)], node_name=NODE,
            config=configs)})
        return ClaimRef(NAMESPACE, name, created["metadata"]["uid"])

    def share_id(self, ref: ClaimRef) -> str:
        claim = self.api.get("resourceclaims", ref.name, NAMESPACE)
        return claim["status"]["allocation"]["devices"]["results"][0]["shareID"]

    def env(self, ref: ClaimRef) -> dict[str, str]:
        recorded = self.preparer.checkpoint.get(ref.uid)
        assert recorded is not None and recorded.claim_spec is not None
        spec = json.loads((self.cdi / recorded.claim_spec).read_text())
        [device] = spec["devices"]
        return dict(e.split("=", 1) for e in device["containerEdits"]["env"])

    def entries(self, ref: ClaimRef) -> list[dict[str, Any]]:
        claim = self.api.get("resourceclaims", ref.name, NAMESPACE)
        return claim.get("status", {}).get("devices", [])


@pytest.fixture
async def node(tmp_path: Path):  # type: ignore[no-untyped-def]
    async with ApiServerEmulator("1.36") as api:
        client = ApiServer.connect(api.write_kubeconfig(tmp_path / "kubeconfig"), 5.0)
        node = Node(tmp_path, api, client)
        try:
            yield node
        finally:
            await node.status.close()
            await node.programmer.close()
            await client.close()


async def until(condition: Any, what: str, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def ready(entry: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in entry["conditions"] if c["type"] == "Ready")


# -- tests -----------------------------------------------------------------------------------

async def test_three_shares_of_one_device_each_get_their_own_environment_and_status(node):
    shares = [node.claim("s1", contexts="1"), node.claim("s2", contexts="2"),
              node.claim("s3", contexts=None)]  # no contexts consumed: one
    results = await node.preparer.prepare(shares)  # one call: admitted together
    assert all(r.ok for r in results.values()), results
    for ref, contexts in zip(shares, (1, 2, 1), strict=True):
        [device] = results[ref.uid].devices
        assert (device.device, device.share_id, device.contexts) == (
            "fpga-0", node.share_id(ref), contexts)
        env = node.env(ref)
        assert env["ACCELERATOR_DEVICES"] == PORT
        assert (env["ACCELERATOR_SHARE_ID"], env["ACCELERATOR_SHARE_CONTEXTS"]) == (
            node.share_id(ref), str(contexts))
    checkpoint = node.preparer.checkpoint
    assert checkpoint.format_version == 3
    assert dict(checkpoint.device_holdings().shared) == {PORT: 4}

    await until(lambda: all(node.entries(r) for r in shares), "every share's status entry")
    for ref, contexts in zip(shares, (1, 2, 1), strict=True):
        [entry] = node.entries(ref)
        assert entry["shareID"] == node.share_id(ref) and entry["device"] == "fpga-0"
        assert entry["data"]["contexts"] == contexts and ready(entry)["status"] == "True"

    node.card.set_port_error(node.card.cards[PORT].ports[0], 0x4)
    node.status.devices_changed()
    await until(lambda: all(ready(node.entries(r)[0])["status"] == "False" for r in shares),
                "every share's entry failed with its device")
    assert {ready(node.entries(r)[0])["reason"] for r in shares} == {"DeviceUnhealthy"}


async def test_more_contexts_than_the_device_has_are_refused_naming_both_numbers(node):
    held = [node.claim("s1", contexts="3")]
    assert (await node.preparer.prepare(held))[held[0].uid].ok
    extra = node.claim("s2", contexts="2")
    error = (await node.preparer.prepare([extra]))[extra.uid].error
    assert error == (f"claim team/s2 ({extra.uid}): device node-a/fpga-0 ({PORT}): the claim "
                     f"asks 2 context(s) and other shares hold 3 (team/s1 ({held[0].uid})), "
                     "more contexts than the device has (4)")
    assert node.preparer.checkpoint.get(extra.uid) is None

    # Two shares in one call cannot both take the last context.
    last = [node.claim("s3", contexts="1"), node.claim("s4", contexts="1")]
    results = await node.preparer.prepare(last)
    assert sorted(r.ok for r in results.values()) == [False, True], results
    assert "more contexts than the device has (4)" in next(
        r.error for r in results.values() if not r.ok)


async def test_a_share_of_a_device_published_whole_is_refused(node):
    node.published = {}
    ref = node.claim("s1")
    error = (await node.preparer.prepare([ref]))[ref.uid].error
    assert error == (f"claim team/s1 ({ref.uid}): share {node.share_id(ref)} of device "
                     f"node-a/fpga-0 ({PORT}): this driver publishes the device whole, not "
                     "shared (a shareID the driver never saw); the claim must be allocated "
                     "again")
    assert len(node.preparer.checkpoint) == 0 and not list(node.cdi.glob("*.json"))


async def test_a_device_has_one_owner_or_only_shares(node):
    whole = node.claim("whole", device="fpga-1", share=False)
    assert (await node.preparer.prepare([whole]))[whole.uid].ok
    node.published[PORT1] = 4  # a setting changed under the claim: still held whole
    share = node.claim("share", device="fpga-1")
    error = (await node.preparer.prepare([share]))[share.uid].error
    assert error.endswith(f"share {node.share_id(share)} of device node-a/fpga-1 ({PORT1}): "
                          f"the device is held whole by team/whole ({whole.uid})"), error

    shared = node.claim("shared", device="fpga-0")
    assert (await node.preparer.prepare([shared]))[shared.uid].ok
    intruder = node.claim("intruder", device="fpga-0", share=False)
    error = (await node.preparer.prepare([intruder]))[intruder.uid].error
    assert error == (f"claim team/intruder ({intruder.uid}): device node-a/fpga-0 ({PORT}) "
                     f"is allocated whole, and shares of it are held by team/shared "
                     f"({shared.uid}): a device has one owner or only shares")


async def test_a_share_of_the_function_held_is_skipped_and_another_is_refused_naming_both(node):
    same = node.claim("same", config=function(NLB0_AFU_ID, "nlb0.gbs"))
    assert (await node.preparer.prepare([same]))[same.uid].ok
    assert node.preparer.checkpoint.get(same.uid).functions[0].result == "skipped"

    other = node.claim("other", config=function(NLB3_AFU_ID, "nlb3.gbs"))
    error = (await node.preparer.prepare([other]))[other.uid].error
    assert error == (f"claim team/other ({other.uid}): share {node.share_id(other)} of device "
                     f"node-a/fpga-0 ({PORT}): the device holds afuID {NLB0_AFU_ID} and the "
                     f"claim's function is afuID {NLB3_AFU_ID} (DeviceClass configuration 0 "
                     "for request fpga); a shared device is never programmed for one of its "
                     "shares, so nothing was loaded")
    assert node.loader.jobs == [], "nothing loaded"
    assert [(name, reason) for name, reason, _ in node.events] == [("other", "FunctionNotHeld")]
    await until(lambda: node.entries(other), "the refusal in the claim's status")
    [entry] = node.entries(other)
    assert entry["shareID"] == node.share_id(other)
    loaded = next(c for c in entry["conditions"] if c["type"] == "FunctionLoaded")
    assert (loaded["status"], loaded["reason"]) == ("False", "NotHeld")
    assert entry["data"]["functionOutcome"] == "not_held"


async def test_a_share_is_valid_only_for_the_function_its_device_was_shared_with(node):
    """A share naming no function (its class selects by the held function's attribute) on
    a device that holds another function now than when it was shared (a clear, a reload by
    hand): refused naming both, nothing loaded, as a claim naming a function would be."""
    node.shared_as = {PORT: SharedAs("intel", HEX[NLB0_AFU_ID])}
    same = node.claim("same")
    assert (await node.preparer.prepare([same]))[same.uid].ok
    afu_id = node.card.ports[node.card.cards[PORT].ports[0]].path / "afu_id"
    afu_id.write_text(HEX[NLB3_AFU_ID] + "\n")  # reloaded by hand, or cleared
    late = node.claim("late")
    error = (await node.preparer.prepare([late]))[late.uid].error
    assert error == (f"claim team/late ({late.uid}): share {node.share_id(late)} of device "
                     f"node-a/fpga-0 ({PORT}): the device was published shared holding "
                     f"afuID {NLB0_AFU_ID} and holds afuID {NLB3_AFU_ID} now (cleared or "
                     "reloaded since); a share is valid only for the function its device was "
                     "shared with, so nothing was loaded and the claim must be allocated "
                     "again")
    assert node.loader.jobs == []
    assert [(name, reason) for name, reason, _ in node.events] == [("late", "FunctionNotHeld")]
    await until(lambda: node.entries(late), "the refusal in the claim's status")
    [entry] = node.entries(late)
    assert entry["data"]["function"] == f"afuID {NLB0_AFU_ID}"
    assert entry["data"]["functionOutcome"] == "not_held"
    # Nothing readable on the device: "nothing".
    afu_id.write_text("garbled\n")
    error = (await node.preparer.prepare([late]))[late.uid].error
    assert f"holding afuID {NLB0_AFU_ID} and holds nothing now" in error, error


async def test_a_device_its_setting_no_longer_shares_takes_no_new_share(node):
    node.shared_as = {PORT: SharedAs("intel", HEX[NLB0_AFU_ID], closed=CLOSED)}
    late = node.claim("late")
    error = (await node.preparer.prepare([late]))[late.uid].error
    assert error == (f"claim team/late ({late.uid}): share {node.share_id(late)} of device "
                     f"node-a/fpga-0 ({PORT}): the device takes no new share ({CLOSED}); it "
                     "stays shared only for the shares that hold it already")


async def test_only_the_last_share_of_a_device_clears_it(node, caplog):
    """A share that is not the last leaves its device alone without trying: no clear
    refused under the other shares (a warning and a ``refused`` count each time)."""
    clearing = function(NLB0_AFU_ID, "nlb0.gbs", clear=(NLB3_AFU_ID, "nlb3.gbs"))
    first, last = node.claim("first", config=clearing), node.claim("last", config=clearing)
    results = await node.preparer.prepare([first, last])
    assert all(r.ok for r in results.values()), results

    with caplog.at_level(logging.INFO, logger="plugin.programming"):
        assert await node.preparer.unprepare([first]) == {first.uid: ""}
        await node.programmer.close()  # every clear started has run
    assert node.loader.jobs == [], "another share still holds the device"
    assert not [r for r in caplog.records if r.name.startswith("plugin.programming")], \
        "no clear tried under the other share"

    assert await node.preparer.unprepare([last]) == {last.uid: ""}
    await node.programmer.close()
    assert [(j.device.id, j.function_id) for j in node.loader.jobs] == [
        (PORT, HEX[NLB3_AFU_ID])]


async def test_a_share_whose_claim_is_gone_is_unprepared_from_the_checkpoint(node):
    gone, other = node.claim("gone", contexts="3"), node.claim("other", contexts="1")
    assert all(r.ok for r in (await node.preparer.prepare([gone, other])).values())
    spec = node.cdi / node.preparer.checkpoint.get(gone.uid).claim_spec
    node.api.delete("resourceclaims", "gone", NAMESPACE)

    assert await node.preparer.unprepare([gone]) == {gone.uid: ""}
    assert not spec.exists()
    assert dict(node.preparer.checkpoint.device_holdings().shared) == {PORT: 1}
    freed = node.claim("freed", contexts="3")
    assert (await node.preparer.prepare([freed]))[freed.uid].ok, "its contexts are free again"


async def test_a_restarted_driver_answers_the_same_shares_and_counts_them(node):
    refs = [node.claim("s1", contexts="2"), node.claim("s2", contexts="2")]
    first = await node.preparer.prepare(refs)
    for ref in refs:
        node.api.delete("resourceclaims", ref.name, NAMESPACE)

    node.preparer = node.new_preparer()
    again = await node.preparer.prepare(refs)
    assert again == first, "answered from the checkpoint, shares and all"
    late = node.claim("late", contexts="1")
    error = (await node.preparer.prepare([late]))[late.uid].error
    assert "other shares hold 4" in error and "more contexts than the device has (4)" in error


async def test_a_contexts_quantity_that_is_no_whole_number_is_the_claims_error(node):
    ref = node.claim("odd", contexts="1500m")  # a quantity the API server accepts
    error = (await node.preparer.prepare([ref]))[ref.uid].error
    assert error == (f"claim team/odd ({ref.uid}) cannot be prepared: ResourceClaim team/odd "
                     "(v1): status.allocation.devices.results[0].consumedCapacity.contexts: "
                     "'1500m' is not a positive whole number of contexts (at most 1048576)")


async def test_a_release_that_reads_only_format_2_refuses_every_claim_while_a_share_is_held(
        node, monkeypatch):
    """0.2.0 reads major format 2 and refuses a newer one (its ``decode``: ``version >
    FORMAT_VERSION`` raises NewerFormat); emulated here by this release's reader told to
    read only 2, over a file a share was recorded in."""
    share, whole = node.claim("share"), node.claim("whole", device="fpga-1", share=False)
    assert all(r.ok for r in (await node.preparer.prepare([share, whole])).values())
    checkpoint = node.state / "claims.jsonl"
    before = checkpoint.read_bytes()

    monkeypatch.setattr(checkpoint_format, "READ_VERSIONS", (2,))
    rolled_back = node.new_preparer()
    fresh = node.claim("fresh", device="fpga-0")
    prepared = await rolled_back.prepare([fresh, share])
    unprepared = await rolled_back.unprepare([whole, share])
    for error in [r.error for r in prepared.values()] + list(unprepared.values()):
        assert error.startswith(f"the DRA driver's claim checkpoint {checkpoint} cannot be "
                                "read (format version 3, written by release "), error
        assert "reads format version 2)" in error and "the kubelet will call again" in error
    assert checkpoint.read_bytes() == before, "left byte for byte"

    monkeypatch.undo()  # rolled forward again: read at the next call
    assert await rolled_back.unprepare([share, whole]) == {share.uid: "", whole.uid: ""}
    assert json.loads(checkpoint.read_text().split("\n", 1)[0])["version"] == 2
