"""ClaimPreparer: calls for one claim that overlap, and unprepares racing prepares.

The 1.36 kubelet calls NodePrepareResources outside its claim-cache lock: two pods sharing a
claim send it at once, and a call repeated after its deadline overlaps the first. A fake
programmer holds a claim in ``settled`` (its device is being cleared) for as long as a test
wants, which is where the first call's deadline passes.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from plugin.serving.dra.checkpoint import ClaimCheckpoint
from plugin.serving.dra.claim_cdi import ClaimSpecs
from plugin.serving.dra.prepare import ClaimPreparer
from plugin.serving.dra.shares import ShareAdmission
from tests.dra_fakes import DRIVER, NAMES, PCI, POOL, FakeClaims, allocation, cdi_ids, ref
from value_types.claims import ClaimAllocation, PreparedDevice

SHARE_IDS = {"a": "5f0c2a9e-3b1d-4c7e-8a6f-2d9e1b7c4a30",
             "b": "9a7b3c2d-1e0f-4a5b-8c6d-7e8f9a0b1c2d",
             "c": "0b6f3c1e-7d2a-4e59-8c41-2f9a6d3e5b70"}


def share(uid: str, contexts: int) -> ClaimAllocation:
    """Claim ``uid`` allocated ``contexts`` of fpga-0 as one share."""
    plain = allocation(uid, "fpga-0")
    return replace(plain, results=(replace(plain.results[0], share_id=SHARE_IDS[uid],
                                           consumed_contexts=contexts),))


class NoClears:
    """The programmer's clears, where no claim names one: nothing pending, nothing resumed."""

    def __init__(self) -> None:
        self.resumed: dict[str, str] = {}

    def record(self, clears):
        assert not clears

    def forget(self, clears):
        list(clears)

    def start(self, clears, holders):
        assert not list(clears)

    def resume(self, held, holders):
        pass


class Clearing:
    """A programmer whose device is being cleared until :attr:`cleared` is set: every claim
    on it waits in ``settled``, as on a real node while a clear or another load runs."""

    def __init__(self) -> None:
        self.clears = NoClears()
        self.cleared = asyncio.Event()
        self.cleared.set()
        self.settling = 0
        self.waiting: dict[str, str] = {}
        self.claimed: dict[str, int] = {}

    def claim_started(self, uid, device_ids):
        self.claimed[uid] = self.claimed.get(uid, 0) + 1

    def claim_finished(self, uid, device_ids=None):
        self.claimed[uid] -= 1
        if not self.claimed[uid]:
            del self.claimed[uid]

    async def settled(self, device_ids):
        list(device_ids)
        self.settling += 1
        try:
            await self.cleared.wait()
        finally:
            self.settling -= 1

    async def held_now(self, device_id):
        await self.settled([device_id])
        return None

    def unprepared(self, uid, outcomes, holders):
        pass


@pytest.fixture
def api():
    return FakeClaims()


@pytest.fixture
def programmer():
    return Clearing()


@pytest.fixture
def preparer(api, programmer, tmp_path):
    return ClaimPreparer(DRIVER, POOL, lambda: NAMES, api, cdi_ids,
                         ClaimCheckpoint(tmp_path / "claims.jsonl"),
                         claim_specs=ClaimSpecs(tmp_path / "cdi", DRIVER, lambda ids: {"X": "1"}),
                         programmer=programmer, published_contexts=lambda: {PCI[0]: 4})


async def until(condition, what):
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never: {what}")


def contexts_recorded(preparer: ClaimPreparer) -> int:
    return sum(d.contexts or 0 for c in preparer.checkpoint.claims.values() for d in c.devices
               if d.device_id == PCI[0])


@pytest.mark.parametrize(("held", "third", "refusal"), [
    (["b"], share("c", 2), "more contexts than the device has (4)"),
    ([], allocation("c", "fpga-0"), "is allocated whole, and shares of it are held by "
     "ns/claim-a (a): a device has one owner or only shares"),
], ids=["contexts", "whole"])
async def test_a_call_given_up_keeps_the_claim_reserved_for_the_call_still_waiting(
        api, programmer, preparer, held, third, refusal):
    """The reproduction: a share recorded (1 of 4 contexts); claim A asks 2 while the device
    is being cleared; the kubelet's first call for A gives up, a second one for A is still
    waiting; a third claim asks 2 more contexts (or the whole device) meanwhile. Without one
    preparation per claim the first call gave back A's reservation and the third claim was
    let in: 5 contexts recorded on a 4-context device, or a whole claim beside a share."""
    api.add(share("b", 1), share("a", 2), third)
    for uid in held:
        assert (await preparer.prepare([ref(uid)]))[uid].ok
    programmer.cleared.clear()
    first = asyncio.create_task(preparer.prepare([ref("a")], timeout=0.3))
    await until(lambda: programmer.settling == 1, "A waiting for the clear")
    second = asyncio.create_task(preparer.prepare([ref("a")], timeout=30))
    assert "could not be prepared within 0 s" in (await first)["a"].error
    late = asyncio.create_task(preparer.prepare([ref("c")], timeout=30))
    await until(lambda: "claim-c" in api.reads, "C read")
    await asyncio.sleep(0.05)
    programmer.cleared.set()
    answers = await asyncio.gather(second, late)
    assert answers[0]["a"].ok, answers[0]
    assert refusal in answers[1]["c"].error
    assert contexts_recorded(preparer) == 2 + len(held) and "c" not in preparer.checkpoint
    assert api.reads.count("claim-a") == 1, "read and let in once for both calls"
    assert programmer.claimed == {} and preparer.flights.in_flight() == frozenset()


async def test_calls_at_once_for_a_claim_get_one_answer_from_one_preparation(
        api, programmer, preparer):
    api.add(share("a", 2))
    programmer.cleared.clear()
    calls = [asyncio.create_task(preparer.prepare([ref("a")], timeout=30)) for _ in range(3)]
    await until(lambda: programmer.settling == 1, "one preparation waiting")
    programmer.cleared.set()
    answers = [(await call)["a"] for call in calls]
    assert all(a.ok for a in answers) and answers[1:] == answers[:-1]
    assert api.reads == ["claim-a"] and preparer.checkpoint.writes == 1
    assert contexts_recorded(preparer) == 2


async def test_the_last_call_to_leave_gives_the_reservation_back(api, programmer, preparer):
    api.add(share("a", 4), share("c", 4))
    programmer.cleared.clear()
    calls = [asyncio.create_task(preparer.prepare([ref("a")], timeout=t)) for t in (0.2, 0.4)]
    answers = [(await call)["a"] for call in calls]
    assert all("could not be prepared within" in a.error for a in answers)
    assert programmer.claimed == {}
    programmer.cleared.set()
    assert (await preparer.prepare([ref("c")]))["c"].ok, "A holds nothing any more"
    assert "a" not in preparer.checkpoint


async def test_an_unprepare_waits_for_the_prepare_under_way_and_undoes_it(
        api, programmer, preparer, tmp_path):
    """Otherwise the unprepare answers done at once, and the prepare then records the claim
    and writes its spec for good: the kubelet has forgotten it, nothing unprepares it."""
    api.add(allocation("a", "fpga-1"))
    programmer.cleared.clear()
    prepare = asyncio.create_task(preparer.prepare([ref("a")], timeout=30))
    await until(lambda: programmer.settling == 1, "A being prepared")
    unprepare = asyncio.create_task(preparer.unprepare([ref("a")]))
    await asyncio.sleep(0.1)
    assert not unprepare.done(), "answered while the claim was being prepared"
    programmer.cleared.set()
    assert (await prepare)["a"].ok
    assert await unprepare == {"a": ""}
    assert "a" not in preparer.checkpoint and list((tmp_path / "cdi").glob("*.json")) == []


async def test_an_unprepare_past_its_deadline_says_the_claim_is_still_being_prepared(
        api, programmer, preparer):
    api.add(allocation("a", "fpga-1"))
    programmer.cleared.clear()
    prepare = asyncio.create_task(preparer.prepare([ref("a")], timeout=30))
    await until(lambda: programmer.settling == 1, "A being prepared")
    answer = await preparer.unprepare([ref("a"), ref("other")], timeout=0.1)
    assert answer["other"] == ""
    assert answer["a"].startswith("claim ns/claim-a (a) is still being prepared after 0 s; "
                                  "the kubelet's next call unprepares it")
    programmer.cleared.set()
    assert (await prepare)["a"].ok and "a" in preparer.checkpoint
    assert await preparer.unprepare([ref("a")]) == {"a": ""}
    assert "a" not in preparer.checkpoint


async def test_a_prepare_during_an_unprepare_of_its_claim_waits_and_prepares_it_anew(
        api, preparer, monkeypatch, tmp_path):
    """Answered from the record while the unprepare removes it, the kubelet would start a
    container on a claim with no record and no spec."""
    api.add(allocation("a", "fpga-1"))
    assert (await preparer.prepare([ref("a")]))["a"].ok
    removing, commit = asyncio.Event(), preparer.checkpoint.commit

    async def slow_commit(put=(), remove=()):
        if remove:
            removing.set()
            await asyncio.sleep(0.1)
        await commit(put=put, remove=remove)

    monkeypatch.setattr(preparer.checkpoint, "commit", slow_commit)
    unprepare = asyncio.create_task(preparer.unprepare([ref("a")]))
    await removing.wait()
    again = await preparer.prepare([ref("a")], timeout=30)
    assert await unprepare == {"a": ""}
    assert again["a"].ok and "a" in preparer.checkpoint
    assert api.reads == ["claim-a", "claim-a"], "read anew once the unprepare was over"
    assert [p.name for p in (tmp_path / "cdi").glob("*.json")] == [f"{DRIVER}_claim_a.json"]


def test_a_claim_let_in_twice_stays_reserved_until_both_give_it_back():
    """Two preparations of one claim (however they came to be): the first to end must not
    free what the second still relies on."""
    def devices(uid: str, contexts: int) -> tuple[PreparedDevice, ...]:
        return (PreparedDevice(POOL, "fpga-0", PCI[0], ("accel",), (), SHARE_IDS[uid],
                               contexts),)

    admission = ShareAdmission(lambda: {PCI[0]: 4}, list, list)
    assert admission.admit(ref("a"), devices("a", 3)) is None
    assert admission.admit(ref("a"), devices("a", 3)) is None
    admission.release("a")
    refusal = admission.admit(ref("c"), devices("c", 2))
    assert refusal is not None and "more contexts than the device has (4)" in refusal
    admission.release("a")
    assert admission.admit(ref("c"), devices("c", 2)) is None


def test_a_preparation_gives_back_only_the_devices_it_started_on(tmp_path):
    """What a preparation that ends takes back from the programmer is its own: the devices
    another preparation of the same claim started on stay claimed."""
    from plugin.programming.programmer import Programmer
    from plugin.programming.quarantine import Quarantine
    from value_types.devices import DeviceSet

    programmer = Programmer(enabled=False, loaders={}, checks=None,
                            quarantine=Quarantine(tmp_path), devices=DeviceSet.of,
                            rescan=lambda _reason: None, driver=DRIVER)
    programmer.claim_started("a", [PCI[0], PCI[1]])
    programmer.claim_started("a", [PCI[1]])
    programmer.claim_finished("a", [PCI[1]])
    assert programmer.preparing() == {PCI[0], PCI[1]}
    programmer.claim_finished("a", [PCI[0], PCI[1]])
    assert programmer.preparing() == frozenset()
