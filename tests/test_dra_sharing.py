"""Which devices are published shared (``--dra-share``), with how many contexts, and the slice
shape that says so, for each resource.k8s.io version, as the emulated 1.36 server takes it."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from api_versions.resource_slices import slices_for
from compat_tests.apiserver import validate
from compat_tests.fpga_images import (
    NLB0_AFU_ID,
    NLB3_AFU_ID,
    XCLBIN_UUID,
    XclbinSpec,
    build_gbs,
    build_xclbin,
    with_compute_units,
    write_image,
)
from plugin.programming.image_checks import ImageChecks
from plugin.programming.library import ImageLibrary
from plugin.programming.load_record import LoadRecord, LoadRecords
from plugin.serving.dra.checkpoint import ClaimCheckpoint
from plugin.serving.dra.inventory import pool_of
from plugin.serving.dra.prepared import PreparedClaim
from plugin.serving.dra.share_setting import parse_shares
from plugin.serving.dra.shares import SharedAs
from plugin.serving.dra.sharing import (
    CLOSED,
    DRAINING,
    MOVED,
    NO_HOLDS,
    UNKNOWN,
    Sharing,
    claim_holds,
    decide,
    shared_as,
)
from value_types.claims import ClaimRef, PreparedDevice
from value_types.devices import Device, DeviceSet, Health
from value_types.pool import Pool

DRIVER = "accelerator.b-com.com"
NODE = "node-a"
UID = "6f1c2a9e-1d0b-4c47-9d8e-2b7f0e5a3c11"
OTHER_UUID = "0f4ed2a3-4c52-4d6e-9d16-7a8d8b2bc7e0"
HEX = XCLBIN_UUID.replace("-", "")


def alveo(device_id: str, xclbin: str | None = XCLBIN_UUID, healthy: bool = True) -> Device:
    attributes = {"pci_address": device_id, "shell": "xilinx_u250_gen3x16_xdma_shell_4_1"}
    if xclbin:
        attributes["xclbin_uuid"] = xclbin
    return Device(id=device_id, backend="alveo", attributes=tuple(attributes.items()),
                  health=Health.HEALTHY if healthy else Health.UNHEALTHY,
                  health_reason="" if healthy else "card offline")


def intel(device_id: str, afu: str = NLB0_AFU_ID) -> Device:
    return Device(id=device_id, backend="intel",
                  attributes=(("afu_id", afu.replace("-", "")), ("pci_address", device_id)))


def aws(device_id: str) -> Device:
    return Device(id=device_id, backend="aws", attributes=(("pci_address", device_id),))


A, B, P, S = "0000:17:00.1", "0000:af:00.1", "0000:d8:00.0", "0000:00:0f.0"
NODE_DEVICES = DeviceSet.of([alveo(A), alveo(B, None), intel(P), aws(S)])


def nothing_read(device: Device) -> int | None:
    raise AssertionError(f"no image should be asked about for {device.id}")


# The decision -------------------------------------------------------------------------------

def test_a_number_shares_every_device_of_the_family_that_holds_a_function() -> None:
    shares = parse_shares("alveo=4,intel=2")
    assert decide(shares, NODE_DEVICES, NO_HOLDS, nothing_read, {}) == {A: 4, P: 2}


@pytest.mark.parametrize("text", ["", "alveo=1", "alveo=off,intel=off", "intel=1"])
def test_off_one_context_or_no_setting_shares_nothing(text: str) -> None:
    assert decide(parse_shares(text), NODE_DEVICES, NO_HOLDS, nothing_read, {}) == {}


def test_an_unhealthy_device_is_still_published_shared() -> None:
    devices = DeviceSet.of([alveo(A, healthy=False)])
    assert decide(parse_shares("alveo=3"), devices, NO_HOLDS, nothing_read, {}) == {A: 3}


def test_a_device_a_claim_holds_whole_is_published_whole() -> None:
    holds = claim_holds({A}, {})
    assert decide(parse_shares("alveo=4"), NODE_DEVICES, holds, nothing_read, {}) == {}


def test_a_device_shares_hold_keeps_the_contexts_it_was_published_with() -> None:
    holds = claim_holds(set(), {A: 3})
    # The setting changed (or the image would say otherwise): the shares keep their N.
    assert decide(parse_shares("alveo=8"), NODE_DEVICES, holds, nothing_read, {A: 4}) == {A: 4}
    assert decide(parse_shares("alveo=off"), NODE_DEVICES, holds, nothing_read,
                  {A: 4}) == {A: 4}
    # Nothing remembered (a restart): what the setting says, never fewer than the shares hold.
    assert decide(parse_shares("alveo=8"), NODE_DEVICES, holds, nothing_read, {}) == {A: 8}
    assert decide(parse_shares("alveo=off"), NODE_DEVICES, holds, nothing_read, {}) == {A: 3}


def test_a_device_a_claim_is_being_prepared_on_keeps_what_it_was_published_as() -> None:
    """A claim loading a function makes its device shareable before the claim is recorded:
    it must not be offered to others in between."""
    holds = claim_holds(set(), {}, preparing={A, P})
    assert decide(parse_shares("alveo=4,intel=2"), NODE_DEVICES, holds, nothing_read,
                  {P: 2}) == {P: 2}


def test_a_record_that_cannot_be_read_shares_nothing() -> None:
    assert decide(parse_shares("alveo=4"), NODE_DEVICES, UNKNOWN, nothing_read, {}) == {}


def test_image_asks_what_the_image_serves_for_devices_that_hold_a_function() -> None:
    asked: list[str] = []

    def served(device: Device) -> int | None:
        asked.append(device.id)
        return {A: 5, P: 1}.get(device.id)

    assert decide(parse_shares("alveo=image,intel=image"), NODE_DEVICES, NO_HOLDS, served,
                  {}) == {A: 5}
    assert sorted(asked) == sorted([A, P])  # the device holding nothing is not asked


# What a shared device is shared as, and when it drains ---------------------------------------

OTHER_HEX = OTHER_UUID.replace("-", "")


def test_a_device_decided_shared_anew_is_shared_as_the_function_it_holds_now() -> None:
    shares = parse_shares("alveo=4")
    found = decide(shares, NODE_DEVICES, NO_HOLDS, nothing_read, {})
    # What it was shared as before is not kept for a device nothing holds: decided anew.
    before = {A: SharedAs("alveo", OTHER_HEX)}
    assert shared_as(shares, NODE_DEVICES, NO_HOLDS, nothing_read, found, before) == {
        A: SharedAs("alveo", HEX)}


def test_a_device_a_clear_is_changing_keeps_what_it_was_shared_as_and_drains() -> None:
    """The clear of the last share's device: the feed may already show the new function,
    but a share placed before the clear is valid only for the one it was shared with."""
    shares = parse_shares("alveo=4")
    holds = claim_holds(set(), {}, changing={A})
    devices = DeviceSet.of([alveo(A, OTHER_UUID)])
    found = decide(shares, devices, holds, nothing_read, {A: 4})
    assert found == {A: 4}
    before = {A: SharedAs("alveo", HEX)}
    [terms] = shared_as(shares, devices, holds, nothing_read, found, before).values()
    assert terms == SharedAs("alveo", HEX, changing=True)
    assert terms.draining and not terms.closed
    # A device published whole before the load stays whole while it is changed.
    assert decide(shares, devices, holds, nothing_read, {}) == {}


def test_shares_under_a_setting_that_no_longer_shares_their_device_drain_it() -> None:
    holds = claim_holds(set(), {A: 1})
    for text, closed in (("alveo=off", CLOSED), ("alveo=1", CLOSED), ("alveo=4", ""),
                         ("alveo=2", "")):
        shares = parse_shares(text)
        found = decide(shares, NODE_DEVICES, holds, nothing_read, {})
        terms = shared_as(shares, NODE_DEVICES, holds, nothing_read, found, {})
        # A restart: shared as what the device holds now, never below what shares hold.
        assert terms == {A: SharedAs("alveo", HEX, closed)}, text
        assert found[A] >= 2 and terms[A].draining == bool(closed)


def test_shares_of_a_device_reloaded_by_hand_under_them_drain_it() -> None:
    shares = parse_shares("alveo=4")
    holds = claim_holds(set(), {A: 1})
    devices = DeviceSet.of([alveo(A, OTHER_UUID)])
    found = decide(shares, devices, holds, nothing_read, {A: 4})
    terms = shared_as(shares, devices, holds, nothing_read, found,
                      {A: SharedAs("alveo", HEX)})
    assert terms == {A: SharedAs("alveo", HEX, MOVED)} and terms[A].draining


async def test_recorded_shares_keep_their_device_shared_with_every_family_off(
        tmp_path: Path) -> None:
    """``--dra-share`` turned off at a restart: the device stays published shared (and
    draining) while its shares run, and goes whole once they are gone."""
    sharing = Sharing(parse_shares("alveo=off"), None, None)
    checkpoint = ClaimCheckpoint(tmp_path / "claims.jsonl")
    device = PreparedDevice("node-a", "pci-0000-17-00-1", A, ("fpga",), (),
                            share_id="6b0f6a2e-1c55-4d0e-9a53-0f4b1f2c8d01", contexts=1)
    await checkpoint.commit(put=[PreparedClaim(ClaimRef("default", "c", "u1"), (device,))])
    republished: list[str] = []
    told = sharing.republishing(lambda _claims: None, lambda: republished.append("r"))
    assert sharing.contexts(NODE_DEVICES, sharing.holds(checkpoint)) == {A: 2}
    assert sharing.draining() == {A}
    await checkpoint.commit(remove=["u1"])
    told(["u1"])
    assert republished == ["r"], "the last share gone: published again"
    assert sharing.contexts(NODE_DEVICES, sharing.holds(checkpoint)) == {}
    assert sharing.draining() == frozenset() and sharing.shared_as == {}
    told(["u2"])
    assert republished == ["r"], "nothing shared, nothing recorded: nothing to publish"


def test_a_load_ending_republishes_only_where_a_device_is_published_shared() -> None:
    sharing = Sharing(parse_shares("alveo=4"), None, None)
    republished: list[str] = []
    ended = sharing.drained(lambda: republished.append("r"))
    ended()
    assert republished == []
    sharing.contexts(NODE_DEVICES, NO_HOLDS)
    ended()
    assert republished == ["r"]


@pytest.mark.parametrize("version", ["v1", "v1beta2", "v1beta1"])
def test_a_draining_device_is_published_shared_with_the_in_use_taint(version: str) -> None:
    pool = pool_of(DRIVER, NODE, NODE_DEVICES, held={A: DRAINING}, shared={A: 2})
    [obj] = slices_for(version, pool, 1, UID, taints=True)
    card = next(fields(version, d) for d in obj["spec"]["devices"]
                if d["name"] == "pci-0000-17-00-1")
    assert card["allowMultipleAllocations"] is True
    assert card["taints"] == [{"key": f"{DRIVER}/in-use", "value": "draining",
                               "effect": "NoSchedule"}]
    assert validate(obj, model="1.36", schema_required=True) == []


# ``image``: the load record and the image's header ----------------------------------------

@pytest.fixture
def library(tmp_path: Path) -> ImageLibrary:
    root = tmp_path / "images"
    write_image(root, "app.xclbin", build_xclbin(with_compute_units(4)))
    write_image(root, "bare.xclbin", build_xclbin(XclbinSpec()))
    write_image(root, "one.xclbin", build_xclbin(with_compute_units(1)))
    write_image(root, "nlb3.gbs", build_gbs(afu_ids=(NLB3_AFU_ID,), contexts=6))
    return ImageLibrary(root)


def loaded(state: Path, device_id: str, function: str, image: str) -> None:
    LoadRecords(state).loaded(device_id, LoadRecord(function.replace("-", ""), "f", image,
                                                    None, "default/c", "now"))


def test_image_counts_what_the_driver_loaded_while_the_device_holds_it(
        tmp_path: Path, library: ImageLibrary) -> None:
    state = tmp_path / "state"
    loaded(state, A, XCLBIN_UUID, "app.xclbin")
    loaded(state, P, NLB3_AFU_ID, "nlb3.gbs")
    sharing = Sharing(parse_shares("alveo=image,intel=image"), ImageChecks(library), state)
    devices = DeviceSet.of([alveo(A), alveo(B, None), intel(P, NLB3_AFU_ID)])
    assert sharing.contexts(devices, NO_HOLDS) == {A: 4, P: 6}
    # Loaded since by other means: the record no longer speaks for the device.
    devices = DeviceSet.of([alveo(A, OTHER_UUID), intel(P, NLB0_AFU_ID)])
    assert sharing.contexts(devices, NO_HOLDS) == {}


@pytest.mark.parametrize(("image", "said"), [
    ("bare.xclbin", "does not say how many users it serves"),
    ("one.xclbin", None),
    ("missing.xclbin", "cannot be read"),
])
def test_an_image_that_cannot_count_leaves_the_device_whole(
        tmp_path: Path, library: ImageLibrary, caplog: pytest.LogCaptureFixture, image: str,
        said: str | None) -> None:
    state = tmp_path / "state"
    loaded(state, A, XCLBIN_UUID, image)
    sharing = Sharing(parse_shares("alveo=image"), ImageChecks(library), state)
    with caplog.at_level(logging.WARNING):
        assert sharing.contexts(DeviceSet.of([alveo(A)]), NO_HOLDS) == {}
        sharing.contexts(DeviceSet.of([alveo(A)]), NO_HOLDS)
    warnings = [r.getMessage() for r in caplog.records if "published whole" in r.getMessage()]
    if said is None:
        assert warnings == []
    else:
        assert len(warnings) == 1 and said in warnings[0]  # said once


def test_an_image_replaced_by_another_function_tells_nothing(
        tmp_path: Path, library: ImageLibrary, caplog: pytest.LogCaptureFixture) -> None:
    state = tmp_path / "state"
    loaded(state, A, XCLBIN_UUID, "app.xclbin")
    sharing = Sharing(parse_shares("alveo=image"), ImageChecks(library), state)
    assert sharing.contexts(DeviceSet.of([alveo(A)]), NO_HOLDS) == {A: 4}
    write_image(library.root, "app.xclbin", build_xclbin(with_compute_units(
        4, XclbinSpec(uuid=OTHER_UUID))))
    with caplog.at_level(logging.WARNING):
        assert sharing.contexts(DeviceSet.of([alveo(A)]), NO_HOLDS) == {}
    assert "replaced in the library?" in caplog.text


# The checkpoint's holds ----------------------------------------------------------------------

def test_holds_come_from_the_checkpoint_once_it_is_read(tmp_path: Path) -> None:
    sharing = Sharing(parse_shares("alveo=2"), None, None)
    checkpoint = ClaimCheckpoint(tmp_path / "claims.jsonl", load=False)
    assert sharing.holds(None) is UNKNOWN
    assert sharing.holds(checkpoint) is UNKNOWN
    assert checkpoint.held() is None  # never read here
    checkpoint.load()
    assert sharing.holds(checkpoint) == NO_HOLDS
    assert Sharing(parse_shares("alveo=off"), None, None).holds(None) is NO_HOLDS


async def test_a_recorded_claim_holds_its_devices_whole(tmp_path: Path) -> None:
    sharing = Sharing(parse_shares("alveo=2"), None, None)
    checkpoint = ClaimCheckpoint(tmp_path / "claims.jsonl")
    device = PreparedDevice("node-a", "pci-0000-17-00-1", A, ("fpga",), ())
    await checkpoint.commit(put=[PreparedClaim(ClaimRef("default", "c", "u1"), (device,))])
    assert sharing.holds(checkpoint).whole == {A}
    await checkpoint.commit(remove=["u1"])
    assert sharing.holds(checkpoint) == NO_HOLDS


async def test_recorded_shares_count_their_contexts_and_hold_nothing_whole(
        tmp_path: Path) -> None:
    """Two shares (2 and 1 contexts) of one device: it is shared, never held whole, so it
    stays published shared with at least the 3 contexts they hold."""
    sharing = Sharing(parse_shares("alveo=2"), None, None)
    checkpoint = ClaimCheckpoint(tmp_path / "claims.jsonl")
    first = PreparedDevice("node-a", "pci-0000-17-00-1", A, ("fpga",), (),
                           share_id="6b0f6a2e-1c55-4d0e-9a53-0f4b1f2c8d01", contexts=2)
    second = PreparedDevice("node-a", "pci-0000-17-00-1", A, ("fpga",), (),
                            share_id="0c1d2e3f-4a5b-4c6d-8e7f-901a2b3c4d5e", contexts=1)
    await checkpoint.commit(put=[PreparedClaim(ClaimRef("default", "c1", "u1"), (first,)),
                                 PreparedClaim(ClaimRef("default", "c2", "u2"), (second,))])
    holds = sharing.holds(checkpoint)
    assert holds.whole == frozenset() and dict(holds.shares) == {A: 3}
    assert decide(parse_shares("alveo=2"), NODE_DEVICES, holds, lambda _: None, {})[A] == 3


# The slice ----------------------------------------------------------------------------------

def shared_pool() -> Pool:
    return pool_of(DRIVER, NODE, NODE_DEVICES, shared={A: 4})


def fields(version: str, device: dict[str, Any]) -> dict[str, Any]:
    return device["basic"] if version == "v1beta1" else device


@pytest.mark.parametrize("version", ["v1", "v1beta2", "v1beta1"])
def test_a_shared_device_is_published_with_multiple_allocations_and_contexts(
        version: str) -> None:
    [obj] = slices_for(version, shared_pool(), 1, UID, taints=True)
    devices = {d["name"]: fields(version, d) for d in obj["spec"]["devices"]}
    card = devices["pci-0000-17-00-1"]
    assert card["allowMultipleAllocations"] is True
    assert card["capacity"] == {"contexts": {"value": "4", "requestPolicy": {
        "default": "1", "validRange": {"min": "1", "max": "4", "step": "1"}}}}
    assert card["attributes"]["xclbinUUID"] == {"string": XCLBIN_UUID}
    for whole in ("pci-0000-af-00-1", "pci-0000-d8-00-0", "pci-0000-00-0f-0"):
        assert "allowMultipleAllocations" not in devices[whole]
        assert "capacity" not in devices[whole]
    assert validate(obj, model="1.36", schema_required=True) == []
    kept = {d["name"]: fields(version, d) for d in stored(obj, "1.36")["spec"]["devices"]}
    assert kept["pci-0000-17-00-1"]["allowMultipleAllocations"] is True
    assert kept["pci-0000-17-00-1"]["capacity"]["contexts"]["requestPolicy"]["validRange"][
        "max"] == "4"


@pytest.mark.parametrize("model", ["1.34", "1.35"])
def test_a_server_with_consumable_capacity_off_stores_the_device_whole(model: str) -> None:
    """1.34 and 1.35 have the gate off by default: the fields are dropped, not refused, and
    the device is then one allocated whole (the scheduler there cannot share it anyway)."""
    [obj] = slices_for("v1beta2", shared_pool(), 1, UID, taints=True)
    assert validate(obj, model=model, schema_required=True) == []
    card = next(d for d in stored(obj, model)["spec"]["devices"]
                if d["name"] == "pci-0000-17-00-1")
    assert "allowMultipleAllocations" not in card
    assert "requestPolicy" not in card["capacity"]["contexts"]


def stored(obj: dict[str, Any], model: str) -> dict[str, Any]:
    """What a ``model`` server keeps of a created ``obj``, read back in its version."""
    from compat_tests.apiserver import load_model, strategy
    from compat_tests.apiserver.pipeline import decode_write, encode_read

    version = obj["apiVersion"].split("/")[1]
    server = load_model(model, {f"resource.k8s.io/{version}": True})
    hub, _ = decode_write("resourceslices", version, obj, server, "Strict")
    strategy.prepare_create("resourceslices", hub, server)
    return encode_read("resourceslices", version, hub, server)


def test_what_was_decided_last_is_readable() -> None:
    sharing = Sharing(parse_shares("alveo=3"), None, None)
    assert sharing.published == {}
    sharing.contexts(NODE_DEVICES, NO_HOLDS)
    assert sharing.published == {A: 3}
    sharing.contexts(NODE_DEVICES, claim_holds({A}, {}))
    assert sharing.published == {}
