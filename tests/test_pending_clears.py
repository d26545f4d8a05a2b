"""Clears recorded before they run, forgotten once their outcome is known, resumed at start."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from plugin.programming.clears import Clears, Holders
from plugin.programming.function_config import FunctionSpec
from plugin.programming.outcome import LOADED, Outcome
from plugin.programming.pending_clears import PendingClear, PendingClears
from plugin.programming.vetting import ProgrammingRefused

NLB0 = FunctionSpec("intel", "afuID", "d8424dc4a4a3c413f89e433683f9040b", "nlb0.gbs",
                    "DeviceClass configuration 0", sha256="ab" * 32)
PORT, OTHER = "0000:3b:00.0", "0000:5e:00.0"


class Ensure:
    """The programmer's ensure: each call recorded, then as told (or held until released)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.refuse = False
        self.release = asyncio.Event()
        self.release.set()

    async def __call__(self, claim: str, uid: str, device_id: str, spec: FunctionSpec,
                       holders: Holders) -> Outcome:
        self.calls.append((uid, device_id))
        await self.release.wait()
        if self.refuse:
            raise ProgrammingRefused("refused")
        return Outcome(device_id, spec, LOADED, "scripted")


def test_the_record_is_read_back_whole_by_the_next_instance(tmp_path: Path) -> None:
    PendingClears(tmp_path).add([PendingClear(PORT, "u1", NLB0)])
    assert PendingClears(tmp_path).read() == {PORT: PendingClear(PORT, "u1", NLB0)}


def test_a_later_clear_of_the_device_is_not_forgotten_with_the_earlier(tmp_path: Path) -> None:
    record = PendingClears(tmp_path)
    record.add([PendingClear(PORT, "u1", NLB0)])
    record.add([PendingClear(PORT, "u2", NLB0)])
    record.remove(PendingClear(PORT, "u1", NLB0))
    assert PendingClears(tmp_path).read() == {PORT: PendingClear(PORT, "u2", NLB0)}


def test_a_record_that_does_not_read_is_said_and_runs_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "pending-clears.json").write_text("{not json")
    assert PendingClears(tmp_path).read() == {}
    assert "may hold the function of its previous claim" in caplog.text


async def test_a_clear_leaves_the_record_once_its_outcome_is_known(tmp_path: Path) -> None:
    ensure = Ensure()
    clears = Clears(ensure, tmp_path, lambda: None)
    for refused in (False, True):
        ensure.refuse = refused
        asked = [PendingClear(PORT, "u", NLB0)]
        clears.record(asked)
        assert PendingClears(tmp_path).read()
        clears.start(asked, lambda _d: [])
        await asyncio.gather(*clears.running())
        assert PendingClears(tmp_path).read() == {}


async def test_a_clear_cut_off_stays_pending(tmp_path: Path) -> None:
    ensure = Ensure()
    ensure.release.clear()
    clears = Clears(ensure, tmp_path, lambda: None)
    clears.record([PendingClear(PORT, "u", NLB0)])
    clears.start([PendingClear(PORT, "u", NLB0)], lambda _d: [])
    await asyncio.sleep(0)
    for task in clears.running():
        task.cancel()
    await asyncio.gather(*clears.running(), return_exceptions=True)
    assert set(PendingClears(tmp_path).read()) == {PORT}


async def test_resumed_clears_skip_devices_a_recorded_claim_holds(tmp_path: Path) -> None:
    PendingClears(tmp_path).add([PendingClear(PORT, "u1", NLB0),
                                 PendingClear(OTHER, "u2", NLB0)])
    ensure = Ensure()
    ensure.release.clear()
    clears = Clears(ensure, tmp_path, lambda: None)
    over: list[bool] = []
    clears.on_resumed_over = lambda: over.append(True)
    clears.resume({OTHER: "ns/holder"}, lambda _d: [])
    assert clears.resumed == {PORT: "u1"} and clears.changing() == {PORT}
    ensure.release.set()
    await asyncio.gather(*clears.running())
    assert ensure.calls == [("clear:u1", PORT)]
    assert clears.resumed == {} and over == [True]
    assert set(PendingClears(tmp_path).read()) == {OTHER}  # kept for its claim's unprepare


async def test_while_stopping_a_clear_is_left_to_the_next_instance(tmp_path: Path) -> None:
    ensure = Ensure()
    clears = Clears(ensure, tmp_path, lambda: None)
    clears.stop()
    asked = [PendingClear(PORT, "u", NLB0)]
    clears.record(asked)
    clears.start(asked, lambda _d: [])
    assert clears.running() == [] and ensure.calls == []
    assert set(PendingClears(tmp_path).read()) == {PORT}
