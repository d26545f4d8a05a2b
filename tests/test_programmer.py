"""The programmer above the seam: skip, load, wait, refuse, quarantine; one load per card.

The loader here is a scripted stand-in that rewrites the fake sysfs as a driver would after a
load; discovery (the real Intel backend) reads the result, as in ``serve``."""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pytest

from compat_tests.fake_sysfs import FakeNode
from compat_tests.fpga_images import (
    NLB0_AFU_ID,
    NLB3_AFU_ID,
    SKX_INTERFACE_ID,
    build_gbs,
    write_image,
)
from plugin.discovery.backends import make_backend
from plugin.programming.digest import DIGEST_STEP
from plugin.programming.function_config import parse_function
from plugin.programming.image_checks import ImageChecks
from plugin.programming.library import ImageLibrary
from plugin.programming.loaders.base import LoadFailed, LoadJob
from plugin.programming.outcome import Outcome
from plugin.programming.programmer import (
    DIGEST_MISMATCH,
    LOADED,
    SKIPPED,
    Programmer,
    ProgrammingRefused,
)
from plugin.programming.quarantine import Quarantine
from value_types.devices import Device, DeviceSet

DRIVER = "accelerator.b-com.com"
PORT = "0000:3b:00.0"
PORT1 = "0000:3b:00.0-port1"
HEX = {NLB0_AFU_ID: NLB0_AFU_ID.replace("-", ""), NLB3_AFU_ID: NLB3_AFU_ID.replace("-", "")}


class ScriptedLoader:
    """Loads by writing the port's afu_id after ``delay``; or fails as told."""

    name = "scripted"
    family = "intel"

    def __init__(self, node: FakeNode, names: dict[str, str]) -> None:
        self.node = node
        self.names = names  # device ID -> port name in the fake tree
        self.delay = 0.0
        self.fail: LoadFailed | None = None
        self.report: str | None = None  # what the port shows after a load (None: the AFU)
        self.jobs: list[LoadJob] = []
        self.running = 0
        self.most_at_once = 0

    def unavailable(self, device: Device) -> str | None:
        return None if device.attribute("fme_node") else "no FME node"

    async def load(self, job: LoadJob) -> None:
        self.jobs.append(job)
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        try:
            await asyncio.sleep(self.delay)
            if self.fail is not None:
                raise self.fail
            self.node.set_afu_id(self.names[job.device.id], self.report or job.function_id)
        finally:
            self.running -= 1

    async def loaded(self, device: Device) -> str | None:
        return None


@pytest.fixture
def node(tmp_path: Path) -> FakeNode:
    node = FakeNode(tmp_path / "node")
    node.add_dfl_card("0000:3b:00.0", ports=2, interface_id=SKX_INTERFACE_ID.replace("-", ""),
                      afu_id=HEX[NLB0_AFU_ID])
    return node


@pytest.fixture
def library(tmp_path: Path) -> ImageLibrary:
    write_image(tmp_path / "images", "nlb0.gbs", build_gbs(afu_ids=(NLB0_AFU_ID,)))
    write_image(tmp_path / "images", "nlb3.gbs", build_gbs(afu_ids=(NLB3_AFU_ID,)))
    write_image(tmp_path / "images", "other-interface.gbs",
                build_gbs(afu_ids=(NLB3_AFU_ID,),
                          interface_id="00000000-1111-2222-3333-444444444444"))
    return ImageLibrary(tmp_path / "images")


def spec(afu: str, image: str):  # type: ignore[no-untyped-def]
    return parse_function(DRIVER, {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "FpgaFunction",
                                   "afuID": afu, "image": image}, "DeviceClass configuration 0",
                          from_class=True)


def programmer_for(node: FakeNode, library: ImageLibrary, tmp_path: Path, *,
                   enabled: bool = True, timeout: float = 5.0
                   ) -> tuple[Programmer, ScriptedLoader]:
    backend = make_backend("intel", node.config())
    names = {PORT: node.cards[PORT].ports[0], PORT1: node.cards[PORT].ports[1]}
    loader = ScriptedLoader(node, names)
    holder: list[Programmer] = []

    def devices() -> DeviceSet:
        return DeviceSet.of(Quarantine(tmp_path / "state").apply(DeviceSet.of(backend.scan())))

    def rescan(reason: str) -> None:
        asyncio.get_running_loop().call_later(0.05, holder[0].devices_changed)

    programmer = Programmer(enabled=enabled, loaders={"intel": loader},
                            checks=ImageChecks(library), quarantine=Quarantine(tmp_path / "state"),
                            devices=devices, rescan=rescan, driver=DRIVER, timeout=timeout)
    programmer.take_ownership()  # as the driver does once it holds its socket
    holder.append(programmer)
    return programmer, loader


def nobody(device_id: str) -> list[str]:
    return []


async def test_a_device_holding_the_function_is_not_programmed(
        node: FakeNode, library: ImageLibrary, tmp_path: Path) -> None:
    programmer, loader = programmer_for(node, library, tmp_path, enabled=False)
    outcome = await programmer.ensure("ns/c", "uid-1", PORT, spec(NLB0_AFU_ID, "nlb0.gbs"), nobody)
    assert outcome.result == SKIPPED and loader.jobs == []
    assert outcome.message() == "afuID d8424dc4-a4a3-c413-f89e-433683f9040b was loaded already"


async def test_another_function_is_loaded_and_answered_once_discovery_reads_it(
        node: FakeNode, library: ImageLibrary, tmp_path: Path) -> None:
    programmer, loader = programmer_for(node, library, tmp_path)
    outcome = await programmer.ensure("ns/c", "uid-1", PORT, spec(NLB3_AFU_ID, "nlb3.gbs"), nobody)
    assert outcome.result == LOADED and outcome.loader == "scripted"
    assert [(j.device.id, j.function_id, j.image) for j in loader.jobs] == [
        (PORT, HEX[NLB3_AFU_ID], "nlb3.gbs")]
    assert make_backend("intel", node.config()).scan()[0].attribute("afu_id") == HEX[NLB3_AFU_ID]
    again = await programmer.ensure("ns/d", "uid-2", PORT, spec(NLB3_AFU_ID, "nlb3.gbs"), nobody)
    assert again.result == SKIPPED and len(loader.jobs) == 1


async def test_programming_off_refuses_a_device_without_the_function(
        node: FakeNode, library: ImageLibrary, tmp_path: Path) -> None:
    programmer, loader = programmer_for(node, library, tmp_path, enabled=False)
    with pytest.raises(ProgrammingRefused, match="programming is off on this node"):
        await programmer.ensure("ns/c", "u", PORT, spec(NLB3_AFU_ID, "nlb3.gbs"), nobody)
    assert loader.jobs == []


@pytest.mark.parametrize(("afu", "image", "words"), [
    (NLB3_AFU_ID, "nlb0.gbs", "holds AFU ID d8424dc4"),
    (NLB3_AFU_ID, "other-interface.gbs", "was built for interface 00000000-1111"),
    (NLB3_AFU_ID, "missing.gbs", "is not in the image library"),
    # Checked on the fast path too: the device already holds nlb0, the image is wrong.
    (NLB0_AFU_ID, "nlb3.gbs", "holds AFU ID f7df405c"),
])
async def test_an_image_that_does_not_fit_is_refused_before_the_card_is_touched(
        node: FakeNode, library: ImageLibrary, tmp_path: Path, afu: str, image: str,
        words: str) -> None:
    programmer, loader = programmer_for(node, library, tmp_path)
    with pytest.raises(ProgrammingRefused, match=words):
        await programmer.ensure("ns/c", "u", PORT, spec(afu, image), nobody)
    assert loader.jobs == []


async def test_a_device_another_claim_holds_is_never_reprogrammed(
        node: FakeNode, library: ImageLibrary, tmp_path: Path) -> None:
    programmer, loader = programmer_for(node, library, tmp_path)
    with pytest.raises(ProgrammingRefused, match=r"for 1 other claim\(s\) \(ns/first\)"):
        await programmer.ensure("ns/c", "u", PORT, spec(NLB3_AFU_ID, "nlb3.gbs"),
                                lambda device_id: ["ns/first"])
    programmer.claim_started("being-prepared", [PORT])
    with pytest.raises(ProgrammingRefused, match="being-prepared"):
        await programmer.ensure("ns/c", "u", PORT, spec(NLB3_AFU_ID, "nlb3.gbs"), nobody)
    assert loader.jobs == []
    programmer.claim_finished("being-prepared")
    assert (await programmer.ensure("ns/c", "u", PORT, spec(NLB3_AFU_ID, "nlb3.gbs"),
                                    nobody)).result == LOADED


async def test_one_load_at_a_time_per_card(node: FakeNode, library: ImageLibrary,
                                           tmp_path: Path) -> None:
    programmer, loader = programmer_for(node, library, tmp_path)
    loader.delay = 0.2
    both = await asyncio.gather(
        programmer.ensure("ns/a", "a", PORT, spec(NLB3_AFU_ID, "nlb3.gbs"), nobody),
        programmer.ensure("ns/b", "b", PORT1, spec(NLB3_AFU_ID, "nlb3.gbs"), nobody))
    assert [o.result for o in both] == [LOADED, LOADED]
    assert loader.most_at_once == 1 and len(loader.jobs) == 2


async def test_a_failed_load_names_the_step_and_quarantines_the_device(
        node: FakeNode, library: ImageLibrary, tmp_path: Path) -> None:
    programmer, loader = programmer_for(node, library, tmp_path)
    loader.fail = LoadFailed("port-PR ioctl", "Input/output error (errno 5)")
    with pytest.raises(ProgrammingRefused, match=r"failed at port-PR ioctl: Input/output error"):
        await programmer.ensure("ns/c", "u", PORT, spec(NLB3_AFU_ID, "nlb3.gbs"), nobody)
    reason = programmer.quarantine.reasons[PORT]
    assert reason.startswith("load failed") and "errno 5" in reason
    marked = programmer.quarantine.apply(DeviceSet.of(make_backend("intel", node.config()).scan()))
    assert not marked.get(PORT).healthy and marked.get(PORT1).healthy
    # Kept across a restart, cleared by a load that works.
    assert PORT in Quarantine(tmp_path / "state").reasons
    loader.fail = None
    assert (await programmer.ensure("ns/c", "u", PORT, spec(NLB3_AFU_ID, "nlb3.gbs"),
                                    nobody)).result == LOADED
    assert PORT not in programmer.quarantine.reasons
    assert PORT not in Quarantine(tmp_path / "state").reasons


async def test_a_quarantined_device_is_loaded_again_even_when_it_seems_to_hold_the_function(
        node: FakeNode, library: ImageLibrary, tmp_path: Path) -> None:
    """What a device whose state is unknown seems to hold is not trusted: a half-done load
    can leave the old AFU ID readable over broken logic."""
    programmer, loader = programmer_for(node, library, tmp_path)
    port = DeviceSet.of(make_backend("intel", node.config()).scan()).get(PORT)
    programmer.quarantine.add(port, "cut off before it ended")
    nlb0 = spec(NLB0_AFU_ID, "nlb0.gbs")  # what the port holds already
    await programmer.check(PORT, nlb0)  # a load is needed, and allowed: no refusal
    outcome = await programmer.ensure("ns/c", "u", PORT, nlb0, nobody)
    assert outcome.result == LOADED and len(loader.jobs) == 1
    assert not programmer.quarantine.holds(PORT)
    # Sound again: the next claim for it loads nothing.
    assert (await programmer.ensure("ns/c2", "u2", PORT, nlb0, nobody)).result == SKIPPED


async def test_a_failure_before_the_card_is_touched_leaves_it_healthy(
        node: FakeNode, library: ImageLibrary, tmp_path: Path) -> None:
    programmer, loader = programmer_for(node, library, tmp_path)
    loader.fail = LoadFailed("fpgaconf", "/usr/bin/fpgaconf not found", touched=False)
    with pytest.raises(ProgrammingRefused, match="not found"):
        await programmer.ensure("ns/c", "u", PORT, spec(NLB3_AFU_ID, "nlb3.gbs"), nobody)
    assert programmer.quarantine.reasons == {}


async def test_a_device_that_never_reports_the_function_fails_within_the_bound(
        node: FakeNode, library: ImageLibrary, tmp_path: Path) -> None:
    programmer, loader = programmer_for(node, library, tmp_path, timeout=1.0)
    loader.report = "f" * 32  # what a crashed AFU reads as
    with pytest.raises(ProgrammingRefused, match="did not report it within 1 s"):
        await programmer.ensure("ns/c", "u", PORT, spec(NLB3_AFU_ID, "nlb3.gbs"), nobody)
    assert PORT in programmer.quarantine.reasons


async def test_a_load_outlives_a_call_the_kubelet_gave_up_on(
        node: FakeNode, library: ImageLibrary, tmp_path: Path) -> None:
    programmer, loader = programmer_for(node, library, tmp_path)
    loader.delay = 0.3
    call = asyncio.create_task(
        programmer.ensure("ns/c", "u", PORT, spec(NLB3_AFU_ID, "nlb3.gbs"), nobody))
    await asyncio.sleep(0.1)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    # The kubelet calls again: the load in flight is awaited, not started twice.
    outcome = await programmer.ensure("ns/c", "u", PORT, spec(NLB3_AFU_ID, "nlb3.gbs"), nobody)
    assert outcome.result == LOADED and len(loader.jobs) == 1
    assert make_backend("intel", node.config()).scan()[0].attribute("afu_id") == HEX[NLB3_AFU_ID]


async def test_a_function_of_another_family_is_refused(
        node: FakeNode, library: ImageLibrary, tmp_path: Path) -> None:
    programmer, _ = programmer_for(node, library, tmp_path)
    aws = parse_function(DRIVER, {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "FpgaFunction",
                                  "agfiID": "agfi-0fcf87119b8e97bf3"}, "claim configuration 0",
                         from_class=False)
    with pytest.raises(ProgrammingRefused, match="function of the aws family, for a intel"):
        await programmer.ensure("ns/c", "u", PORT, aws, nobody)


async def test_a_class_that_clears_on_unprepare_loads_its_function_after_the_claim(
        node: FakeNode, library: ImageLibrary, tmp_path: Path) -> None:
    programmer, loader = programmer_for(node, library, tmp_path)
    nlb3_then_nlb0 = with_clear(NLB3_AFU_ID, "nlb3.gbs", NLB0_AFU_ID, "nlb0.gbs")
    loaded = await programmer.ensure("ns/c", "u", PORT, nlb3_then_nlb0, nobody)
    assert loaded.result == LOADED
    programmer.unprepared("u", [loaded], nobody)
    await programmer.close()
    assert [j.function_id for j in loader.jobs] == [HEX[NLB3_AFU_ID], HEX[NLB0_AFU_ID]]
    assert make_backend("intel", node.config()).scan()[0].attribute("afu_id") == HEX[NLB0_AFU_ID]
    programmer.unprepared("u", [], nobody)  # nothing recorded: nothing to clear
    await programmer.close()
    assert len(loader.jobs) == 2


async def test_a_clear_never_loads_under_a_claim_that_holds_the_device_by_then(
        node: FakeNode, library: ImageLibrary, tmp_path: Path) -> None:
    programmer, loader = programmer_for(node, library, tmp_path)
    nlb3_then_nlb0 = with_clear(NLB3_AFU_ID, "nlb3.gbs", NLB0_AFU_ID, "nlb0.gbs")
    loaded = await programmer.ensure("ns/c", "u", PORT, nlb3_then_nlb0, nobody)
    programmer.unprepared("u", [loaded], lambda device_id: ["ns/next"])
    await programmer.close()
    assert len(loader.jobs) == 1


def test_what_was_loaded_is_recorded_with_the_claim_and_read_past_when_damaged(
        caplog: pytest.LogCaptureFixture) -> None:
    from plugin.serving.dra.prepared import PreparedClaim
    from value_types.claims import ClaimRef, PreparedDevice

    clear = spec(NLB0_AFU_ID, "nlb0.gbs")
    loaded = Outcome(PORT, replace(spec(NLB3_AFU_ID, "nlb3.gbs"), clear=clear), LOADED,
                     "ioctl", 4.2)
    claim = PreparedClaim(ClaimRef("ns", "c", "u"), (
        PreparedDevice("node", "pci-0000-3b-00-0", PORT, ("fpga",), ("k/c=x",)),),
        None, (loaded,))
    data = json.loads(json.dumps(claim.to_json()))
    again = PreparedClaim.from_json("u", data)
    assert again == claim and again.function(PORT).spec.clear == clear
    assert again.function(PORT1) is None
    data["functions"] = [{"device_id": PORT, "spec": "garbled"}]
    kept = PreparedClaim.from_json("u", data)
    assert kept.devices == claim.devices and kept.functions == ()
    assert "kept without them" in caplog.text


def test_an_image_header_is_read_again_when_the_file_changes_or_leaves_the_library(
        node: FakeNode, library: ImageLibrary, tmp_path: Path) -> None:
    checks = ImageChecks(library)
    device = next(d for d in make_backend("intel", node.config()).scan() if d.id == PORT)
    nlb3 = spec(NLB3_AFU_ID, "nlb3.gbs")
    checks.check(nlb3, device)  # read and remembered
    # Replaced in place by another function's image: read again, and refused.
    (library.root / "nlb3.gbs").write_bytes(build_gbs(afu_ids=(NLB0_AFU_ID,)) + b"\0")
    with pytest.raises(ValueError, match="holds AFU ID d8424dc4"):
        checks.check(nlb3, device)
    # Replaced by a symlink to a good image outside the library: refused, however remembered.
    outside = write_image(tmp_path / "elsewhere", "nlb3.gbs", build_gbs(afu_ids=(NLB3_AFU_ID,)))
    (library.root / "nlb3.gbs").unlink()
    (library.root / "nlb3.gbs").symlink_to(outside)
    with pytest.raises(ValueError, match="outside the image library"):
        checks.check(nlb3, device)


# --- races: claims, clears and loads on one card --------------------------------------------

def with_clear(afu: str, image: str, clear_afu: str, clear_image: str):  # type: ignore[no-untyped-def]
    return parse_function(DRIVER, {
        "apiVersion": f"{DRIVER}/v1alpha1", "kind": "FpgaFunction", "afuID": afu,
        "image": image, "clearOnUnprepare": {"afuID": clear_afu, "image": clear_image}},
        "DeviceClass configuration 0", from_class=True)


def held_now(node: FakeNode) -> str:
    return next(d for d in make_backend("intel", node.config()).scan()
                if d.id == PORT).attribute("afu_id")


async def test_a_claim_is_never_answered_while_a_clear_changes_its_device(
        node: FakeNode, library: ImageLibrary, tmp_path: Path) -> None:
    programmer, loader = programmer_for(node, library, tmp_path)
    loader.delay = 0.5
    first = with_clear(NLB0_AFU_ID, "nlb0.gbs", NLB3_AFU_ID, "nlb3.gbs")
    programmer.unprepared("A", [replace(
        await programmer.ensure("ns/a", "A", PORT, first, nobody))], nobody)  # clear to nlb3
    await asyncio.sleep(0.1)
    programmer.claim_started("B", [PORT])
    b = await programmer.ensure("ns/b", "B", PORT, spec(NLB0_AFU_ID, "nlb0.gbs"), nobody)
    await programmer.close()
    # B waited for the clear, then had its own function loaded back: what it was told holds.
    assert b.result == LOADED and held_now(node) == HEX[NLB0_AFU_ID]
    # A claim naming no function waits for a load in flight before it is answered.
    programmer.claim_finished("B")
    loader.delay = 0.3
    programmer.unprepared("C", [replace(b, spec=with_clear(
        NLB0_AFU_ID, "nlb0.gbs", NLB3_AFU_ID, "nlb3.gbs"))], nobody)
    await asyncio.sleep(0.05)
    began = asyncio.get_running_loop().time()
    await programmer.settled([PORT])
    assert asyncio.get_running_loop().time() - began > 0.15
    assert held_now(node) == HEX[NLB3_AFU_ID]


async def test_a_clear_never_starts_under_a_claim_being_prepared(
        node: FakeNode, library: ImageLibrary, tmp_path: Path) -> None:
    programmer, loader = programmer_for(node, library, tmp_path)
    first = with_clear(NLB0_AFU_ID, "nlb0.gbs", NLB3_AFU_ID, "nlb3.gbs")
    held = await programmer.ensure("ns/a", "A", PORT, first, nobody)
    programmer.claim_started("plain", [PORT])  # a claim naming no function, being prepared
    programmer.unprepared("A", [held], nobody)
    await programmer.close()
    assert loader.jobs == [] and held_now(node) == HEX[NLB0_AFU_ID]


async def test_another_claims_failed_load_is_not_this_claims_error(
        node: FakeNode, library: ImageLibrary, tmp_path: Path) -> None:
    programmer, loader = programmer_for(node, library, tmp_path)
    loader.delay = 0.2
    loader.fail = LoadFailed("port-PR ioctl", "Input/output error (errno 5)")
    a = asyncio.create_task(
        programmer.ensure("ns/a", "A", PORT, spec(NLB3_AFU_ID, "nlb3.gbs"), nobody))
    await asyncio.sleep(0.05)

    async def b_after_a_failed() -> object:
        await asyncio.wait([a])
        loader.fail = None
        return None

    mend = asyncio.create_task(b_after_a_failed())
    b = await programmer.ensure("ns/b", "B", PORT1, spec(NLB3_AFU_ID, "nlb3.gbs"), nobody)
    await mend
    with pytest.raises(ProgrammingRefused, match="errno 5"):
        await a
    assert b.result == LOADED  # B's own load, on its own port, once A's was over


async def test_the_load_budget_counts_from_when_the_card_is_free(
        node: FakeNode, library: ImageLibrary, tmp_path: Path) -> None:
    programmer, loader = programmer_for(node, library, tmp_path, timeout=1.0)
    loader.delay = 0.6
    both = await asyncio.gather(
        programmer.ensure("ns/a", "a", PORT, spec(NLB3_AFU_ID, "nlb3.gbs"), nobody),
        programmer.ensure("ns/b", "b", PORT1, spec(NLB3_AFU_ID, "nlb3.gbs"), nobody))
    assert [o.result for o in both] == [LOADED, LOADED]
    assert min(job.timeout for job in loader.jobs) > 0.9  # not what the first load left


async def test_stopping_waits_for_a_load_whose_call_was_given_up(
        node: FakeNode, library: ImageLibrary, tmp_path: Path) -> None:
    programmer, loader = programmer_for(node, library, tmp_path)
    loader.delay = 0.4
    call = asyncio.create_task(
        programmer.ensure("ns/a", "A", PORT, spec(NLB3_AFU_ID, "nlb3.gbs"), nobody))
    await asyncio.sleep(0.1)
    call.cancel()
    await asyncio.gather(call, return_exceptions=True)
    await programmer.close()
    assert loader.running == 0 and held_now(node) == HEX[NLB3_AFU_ID]
    assert programmer.quarantine.reasons == {}


async def test_a_load_cut_off_all_the_same_leaves_the_device_unknown(
        node: FakeNode, library: ImageLibrary, tmp_path: Path) -> None:
    programmer, loader = programmer_for(node, library, tmp_path)
    loader.delay = 5.0
    call = asyncio.create_task(
        programmer.ensure("ns/a", "A", PORT, spec(NLB3_AFU_ID, "nlb3.gbs"), nobody))
    while not loader.running:  # the load has begun: the card may be touched from here on
        await asyncio.sleep(0.01)
    for task in list(programmer._loading.values()):  # what a killed event loop does
        task.cancel()
    await asyncio.gather(call, return_exceptions=True)
    assert "cut off before it ended" in programmer.quarantine.reasons[PORT]


async def test_a_second_call_for_a_claim_keeps_it_registered_until_both_end(
        node: FakeNode, library: ImageLibrary, tmp_path: Path) -> None:
    programmer, loader = programmer_for(node, library, tmp_path)
    programmer.claim_started("A", [PORT])
    programmer.claim_started("A", [PORT])  # the kubelet called again
    programmer.claim_finished("A")  # the first call ends
    with pytest.raises(ProgrammingRefused, match=r"other claim\(s\) \(A\)"):
        await programmer.ensure("ns/b", "B", PORT, spec(NLB3_AFU_ID, "nlb3.gbs"), nobody)
    assert loader.jobs == []


async def test_every_load_hands_the_loader_the_digest_of_the_bytes_checked(
        node: FakeNode, library: ImageLibrary, tmp_path: Path) -> None:
    """Even unpinned, the loader is told which bytes it must load: the audit's digest is
    the one that reached the card."""
    programmer, loader = programmer_for(node, library, tmp_path)
    outcome = await programmer.ensure("ns/c", "uid-1", PORT, spec(NLB3_AFU_ID, "nlb3.gbs"), nobody)
    expected = hashlib.sha256((library.root / "nlb3.gbs").read_bytes()).hexdigest()
    assert [job.sha256 for job in loader.jobs] == [expected]
    assert outcome.sha256 == expected


async def test_a_file_replaced_after_the_check_is_refused_by_the_loader_and_not_quarantined(
        node: FakeNode, library: ImageLibrary, tmp_path: Path) -> None:
    programmer, loader = programmer_for(node, library, tmp_path)
    loader.fail = LoadFailed(DIGEST_STEP, "image 'nlb3.gbs' has sha256 ab.., not the sha256 "
                             "cd.. its configuration pins; nothing was loaded", touched=False)
    with pytest.raises(ProgrammingRefused) as refused:
        await programmer.ensure("ns/c", "uid-1", PORT, spec(NLB3_AFU_ID, "nlb3.gbs"), nobody)
    assert refused.value.result == DIGEST_MISMATCH
    assert "nothing was loaded" in str(refused.value)
    assert programmer.quarantine.reasons == {}


async def test_the_digest_of_an_unchanged_file_is_taken_once(
        node: FakeNode, library: ImageLibrary, tmp_path: Path) -> None:
    programmer, _ = programmer_for(node, library, tmp_path)
    digest = hashlib.sha256((library.root / "nlb0.gbs").read_bytes()).hexdigest()
    pinned = replace(spec(NLB0_AFU_ID, "nlb0.gbs"), sha256=digest)
    checks = programmer.checks
    assert checks is not None
    for uid in ("a", "b", "c"):
        assert (await programmer.ensure("ns/c", uid, PORT, pinned, nobody)).result == SKIPPED
    assert checks.hashed == 1
    (library.root / "nlb0.gbs").write_bytes((library.root / "nlb0.gbs").read_bytes())
    assert (await programmer.ensure("ns/c", "d", PORT, pinned, nobody)).result == SKIPPED
    assert checks.hashed == 2  # rewritten (a new ctime): hashed again
