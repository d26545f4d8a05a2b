"""Who may load what, from which bytes: the admin's catalogue, pinned images, and the audit.

Against the real ``serve`` (emulated 1.36 API server and kubelet, a fake node, stand-in vendor
tools: :func:`compat_tests.test_dra_programming_serve.running`), as a tenant and an admin
would meet it:

* a claim's own function is refused unless its DeviceClass lists it, naming the class, the
  function and the field, in the kubelet's error, an Event regarding the claim and the
  claim's status; nothing is loaded;
* an image whose bytes are not the pinned ``sha256`` is refused before the card, naming the
  file and both digests, counted, said, and the device is not quarantined;
* ``--require-image-digest`` refuses a function whose configuration pins no digest;
* every load leaves one structured audit line and an Event regarding the claim, with the
  digest of the bytes that were loaded.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from compat_tests.dra_support import until
from compat_tests.fake_sysfs import DEFAULT_AFU_ID
from compat_tests.fpga_images import NLB3_AFU_ID
from compat_tests.test_dra_auto import Scraper, key
from compat_tests.test_dra_programming_metrics import metrics_flags
from compat_tests.test_dra_programming_serve import (
    DFL_BDF,
    DFL_PORT,
    DRIVER,
    NAMESPACE,
    NLB3,
    World,
    function,
    running,
)

IMAGE = "intel/nlb3.gbs"


def own(**fields: Any) -> dict[str, Any]:
    """The claim's own configuration (``FromClaim``), as a tenant writes it."""
    entry = function(**fields)
    return {**entry, "source": "FromClaim"}


def digest_of(world: World, name: str = IMAGE) -> str:
    return hashlib.sha256((world.library / name).read_bytes()).hexdigest()


def claim_events(world: World, reason: str, claim: str) -> list[dict[str, Any]]:
    return [e for e in world.api.list("events", NAMESPACE) if e["reason"] == reason
            and e["regarding"].get("kind") == "ResourceClaim"
            and e["regarding"].get("name") == claim]


def status(world: World, claim: str) -> list[dict[str, Any]]:
    obj = world.api.get("resourceclaims", claim, NAMESPACE)
    return list((obj or {}).get("status", {}).get("devices", []))


def audit_lines(world: World, outcome: str) -> list[dict[str, Any]]:
    return [e["audit"] for e in world.plugin.entries()
            if isinstance(e.get("audit"), dict) and e["audit"]["outcome"] == outcome]


@pytest.fixture
async def world(tmp_path: Path, sockdir: Path, logdir: Path) -> AsyncIterator[World]:
    async for w in running(tmp_path, sockdir, logdir, *metrics_flags()):
        yield w


@pytest.fixture
async def strict(tmp_path: Path, sockdir: Path, logdir: Path) -> AsyncIterator[World]:
    async for w in running(tmp_path, sockdir, logdir, "--require-image-digest"):
        yield w


async def test_a_tenants_own_function_is_refused_unless_its_class_allows_it(
        world: World) -> None:
    ref = world.claim("tenant", DFL_PORT, own(afuID=NLB3_AFU_ID, image=IMAGE))
    result = await world.prepare(ref)
    assert f"DeviceClass '{DRIVER}' does not let claims choose afuID {NLB3_AFU_ID}" in \
        result.error, result.error
    assert "(field afuID)" in result.error and "claim configuration 0" in result.error
    assert world.tools.invocations() == []
    assert world.published()[DFL_PORT]["afuID"] == DEFAULT_AFU_ID
    # Said where the tenant and the admin look: the claim's Events and its status.
    await until(lambda: claim_events(world, "FunctionNotAllowed", "tenant"),
                "a FunctionNotAllowed Event regarding the claim")
    event = claim_events(world, "FunctionNotAllowed", "tenant")[0]
    assert event["type"] == "Warning"
    assert event["regarding"]["uid"] == ref.uid
    assert event["regarding"]["namespace"] == NAMESPACE
    assert "tenant-pod" in event["note"] and DFL_BDF in event["note"]
    await until(lambda: status(world, "tenant"), "the refusal in the claim's status")
    entry = status(world, "tenant")[0]
    condition = next(c for c in entry["conditions"] if c["type"] == "FunctionLoaded")
    assert (condition["status"], condition["reason"]) == ("False", "NotAllowed")
    assert entry["data"]["functionOutcome"] == "not_allowed"
    [line] = audit_lines(world, "not_allowed")
    assert (line["namespace"], line["claim"], line["uid"], line["pods"]) == (
        NAMESPACE, "tenant", ref.uid, ["tenant-pod"])
    assert (line["device_class"], line["device_id"]) == (DRIVER, DFL_BDF)
    scraped = (await Scraper.of(world.plugin)).samples()
    assert scraped.get(key("dra_programming_total__family=intel,loader=,"
                           "result=not_allowed")) == 1
    assert world.plugin.alive


async def test_a_function_the_class_lists_may_be_chosen_and_its_load_is_audited(
        world: World) -> None:
    digest = digest_of(world)
    ref = world.claim("chosen", DFL_PORT,
                      function(allowedClaimFunctions=[{"afuID": NLB3_AFU_ID, "image": IMAGE}]),
                      own(afuID=NLB3_AFU_ID, image=IMAGE))
    result = await world.prepare(ref)
    assert result.ok, result.error
    assert len(world.tools.invocations("fpgaconf")) == 1
    await until(lambda: claim_events(world, "FunctionLoaded", "chosen"),
                "a FunctionLoaded Event regarding the claim")
    note = claim_events(world, "FunctionLoaded", "chosen")[0]["note"]
    assert f"sha256 {digest}" in note and IMAGE in note and "chosen-pod" in note
    [line] = audit_lines(world, "loaded")
    assert (line["sha256"], line["image"], line["node"]) == (digest, IMAGE, "node-a")
    await until(lambda: status(world, "chosen"), "the claim's status")
    assert status(world, "chosen")[0]["data"]["functionImageSHA256"] == digest


async def test_a_digest_mismatch_is_refused_before_the_card_and_quarantines_nothing(
        world: World) -> None:
    wrong = "0" * 64
    ref = world.claim("pinned", DFL_PORT, function(afuID=NLB3_AFU_ID, image=IMAGE,
                                                   sha256=wrong))
    result = await world.prepare(ref)
    actual = digest_of(world)
    assert f"image '{IMAGE}' has sha256 {actual}, not the sha256 {wrong}" in result.error, \
        result.error
    assert world.tools.invocations() == []
    await until(lambda: claim_events(world, "ImageDigestMismatch", "pinned"),
                "an ImageDigestMismatch Event regarding the claim")
    scraped = (await Scraper.of(world.plugin)).samples()
    assert scraped.get(key("dra_programming_total__family=intel,loader=,"
                           "result=digest_mismatch")) == 1
    assert scraped.get(key("devices_load_failed")) == 0
    assert not world.published()[DFL_PORT]["taints"]
    # The right digest loads: the device was never marked unknown.
    good = world.claim("pinned-right", DFL_PORT, function(afuID=NLB3_AFU_ID, image=IMAGE,
                                                          sha256=actual))
    assert (await world.prepare(good)).ok
    await until(lambda: world.published()[DFL_PORT]["afuID"] == NLB3, "loaded")


async def test_a_replaced_image_is_hashed_again_and_refused(world: World) -> None:
    digest = digest_of(world)
    config = function(afuID=NLB3_AFU_ID, image=IMAGE, sha256=digest)
    # Checked (and remembered) once: the device already holds another function, so a
    # claim on the port is loaded; a clear of it afterwards is not the point here.
    first = world.claim("before", DFL_PORT, config)
    assert (await world.prepare(first)).ok
    # The library file is replaced (same name, other bytes): the next claim naming the
    # pinned digest is refused, though the fast path would skip the load.
    path = world.library / IMAGE
    path.write_bytes(path.read_bytes() + b"\0")
    again = world.claim("after", DFL_PORT, config)
    result = await world.prepare(again)
    assert f"not the sha256 {digest}" in result.error, result.error
    assert len(world.tools.invocations("fpgaconf")) == 1


async def test_a_node_requiring_digests_refuses_a_function_without_one(strict: World) -> None:
    result = await strict.prepare(strict.claim("loose", DFL_PORT,
                                               function(afuID=NLB3_AFU_ID, image=IMAGE)))
    assert "does not pin image intel/nlb3.gbs with sha256" in result.error, result.error
    assert "--require-image-digest" in result.error
    assert strict.tools.invocations() == []
    pinned = strict.claim("pinned", DFL_PORT, function(afuID=NLB3_AFU_ID, image=IMAGE,
                                                       sha256=digest_of(strict)))
    assert (await strict.prepare(pinned)).ok


async def test_discover_shows_the_digest_of_what_the_driver_loaded(world: World,
                                                                   sockdir: Path) -> None:
    ref = world.claim("nlb3", DFL_PORT, function(afuID=NLB3_AFU_ID, image=IMAGE))
    assert (await world.prepare(ref)).ok
    await until(lambda: world.published()[DFL_PORT]["afuID"] == NLB3, "loaded")

    def discovered() -> dict[str, Any]:
        result = subprocess.run(
            [sys.executable, "-m", "plugin", "discover", "--backend", "auto", "--json",
             "--sysfs-root", str(world.node.sysfs_root), "--dev-root",
             str(world.node.dev_root), "--dra-state-dir", str(sockdir / "state")],
            capture_output=True, text=True, timeout=60, check=True)
        return {d["id"]: d for d in json.loads(result.stdout)}

    record = discovered()[DFL_BDF]["loaded_by_driver"]
    assert record is not None
    assert (record["image"], record["sha256"]) == (IMAGE, digest_of(world))
    assert record["claim"] == f"{NAMESPACE}/nlb3 ({ref.uid})"
    # Loaded since by other means: no digest is shown rather than a wrong one.
    world.node.set_afu_id(world.node.cards[DFL_BDF].ports[0], DEFAULT_AFU_ID)
    assert discovered()[DFL_BDF]["loaded_by_driver"] is None
