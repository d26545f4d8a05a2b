"""The card lock and records every process that may program a card shares on the node.

Loads run through :class:`CardLockedLoader` around a stand-in loader; the lock is the real
``flock`` on files in a temporary state directory, taken from separate threads (each its
own open file description, as two processes have), and the quarantine reads the records
as the driver does when it takes the socket."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest

from plugin.programming.card_state import CardFiles, CardRecord, Intent
from plugin.programming.loaders.base import LoadFailed, LoadJob
from plugin.programming.loaders.card_locked import LOCK_STEP, CardLockedLoader
from plugin.programming.loaders.tools import run_tool
from plugin.programming.quarantine import FILE_NAME, Quarantine
from value_types.devices import Device, DeviceSet

PORT = "0000:3b:00.0"
FME = "/dev/dfl-fme.0"
NLB3 = "d8424dc4a4a3c413f89e433683f9040b"


def port(device_id: str = PORT) -> Device:
    return Device(id=device_id, backend="intel",
                  attributes=(("fme_node", FME), ("pci_address", PORT)))


class Stand:
    """A loader that notes when each load begins and ends, and can fail or run a tool."""

    name = "stand-in"
    family = "intel"

    def __init__(self, files: CardFiles, delay: float = 0.0) -> None:
        self.files = files
        self.delay = delay
        self.fail: LoadFailed | None = None
        self.tool: Path | None = None
        self.spans: list[tuple[str, float]] = []
        self.seen: list[CardRecord] = []

    def unavailable(self, device: Device) -> str | None:
        return None

    async def loaded(self, device: Device) -> str | None:
        return None

    async def load(self, job: LoadJob) -> None:
        self.seen.append(self.files.read(FME))
        self.spans.append(("begin", time.monotonic()))
        await asyncio.sleep(self.delay)
        if self.tool is not None:
            await run_tool(self.tool, [], step="tool", flag="--tool", timeout=job.timeout)
        self.spans.append(("end", time.monotonic()))
        if self.fail is not None:
            raise self.fail


def job(timeout: float = 5.0) -> LoadJob:
    return LoadJob(port(), NLB3, image="nlb3.gbs", timeout=timeout)


def test_two_loaders_never_program_one_card_at_once(tmp_path: Path) -> None:
    """Two threads, each its own loader and open of the lock file, as two processes."""
    stands = [Stand(CardFiles(tmp_path), delay=0.3) for _ in range(2)]
    errors: list[BaseException] = []

    def run(stand: Stand) -> None:
        try:
            asyncio.run(CardLockedLoader(stand, stand.files).load(job()))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(s,)) for s in stands]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors
    (b1, t_b1), (e1, t_e1) = stands[0].spans
    (b2, t_b2), (e2, t_e2) = stands[1].spans
    assert (b1, e1, b2, e2) == ("begin", "end", "begin", "end")
    assert t_e1 <= t_b2 or t_e2 <= t_b1, "the two loads overlapped"


async def test_a_card_busy_past_the_budget_fails_untouched_naming_the_load_waited_for(
        tmp_path: Path) -> None:
    files = CardFiles(tmp_path)
    files.update(FME, lambda r: setattr(r, "intent", Intent("other", "f" * 32, "x.gbs", 4242,
                                                            "2025-01-01T00:00:00Z")))
    held = files.try_lock(FME)
    assert held is not None
    stand = Stand(files)
    try:
        with pytest.raises(LoadFailed) as failed:
            await CardLockedLoader(stand, files).load(job(timeout=0.3))
    finally:
        held.release()
    assert failed.value.step == LOCK_STEP and failed.value.touched is False
    assert "by process 4242" in failed.value.detail and "nothing was loaded" in failed.value.detail
    assert stand.spans == []


async def test_the_intent_is_recorded_before_the_load_and_removed_after(tmp_path: Path) -> None:
    files = CardFiles(tmp_path)
    stand = Stand(files)
    await CardLockedLoader(stand, files).load(job())
    [during] = stand.seen
    assert during.intent is not None and during.intent.device == PORT
    assert during.intent.function == NLB3
    assert not files.record_path(FME).exists()  # said nothing more: removed


async def test_a_touched_failure_is_recorded_by_the_process_that_ran_it(tmp_path: Path) -> None:
    files = CardFiles(tmp_path)
    stand = Stand(files)
    stand.fail = LoadFailed("fpgaconf", "PR failed: timeout")
    with pytest.raises(LoadFailed):
        await CardLockedLoader(stand, files).load(job())
    record = files.read(FME)
    assert record.intent is None
    assert "PR failed: timeout" in record.quarantined[PORT]
    assert record.quarantined[PORT].startswith("load failed")
    stand.fail = LoadFailed("fpgaconf", "not found", touched=False)
    files.update(FME, lambda r: r.quarantined.clear())
    with pytest.raises(LoadFailed):
        await CardLockedLoader(stand, files).load(job())
    assert not files.record_path(FME).exists()  # untouched: nothing to keep


async def test_the_tool_keeps_the_card_locked_until_it_exits(tmp_path: Path) -> None:
    """A helper the tool leaves behind (as a killed parent leaves the tool) still holds it."""
    tool = tmp_path / "tool"
    tool.write_text("#!/bin/sh\n(sleep 1.5) >/dev/null 2>&1 &\nexit 0\n")
    tool.chmod(0o755)
    files = CardFiles(tmp_path / "state")
    stand = Stand(files)
    stand.tool = tool
    await CardLockedLoader(stand, files).load(job())
    assert files.try_lock(FME) is None  # the loader let go; the tool's helper has not
    for _ in range(100):
        free = files.try_lock(FME)
        if free is not None:
            free.release()
            break
        await asyncio.sleep(0.1)
    else:
        pytest.fail("the lock was never freed")


def write_intent(files: CardFiles, device_id: str = PORT) -> Intent:
    intent = Intent(device_id, NLB3, "nlb3.gbs", 4242, "2025-01-01T00:00:00Z")
    files.update(FME, lambda r: setattr(r, "intent", intent))
    return intent


async def test_an_intent_whose_lock_is_free_quarantines_its_device_as_interrupted(
        tmp_path: Path) -> None:
    files = CardFiles(tmp_path)
    write_intent(files)
    quarantine = Quarantine(tmp_path)
    quarantine.take_ownership()
    assert quarantine.reasons[PORT].startswith("load interrupted: state unknown after a load "
                                               "was interrupted")
    marked = quarantine.apply(DeviceSet.of([port(), port("other")]))
    assert not marked.get(PORT).healthy and marked.get("other").healthy
    record = files.read(FME)  # the record says so from now on
    assert record.intent is None and "interrupted" in record.quarantined[PORT]


async def test_an_intent_whose_lock_is_held_waits_for_that_load_then_reads_its_outcome(
        tmp_path: Path) -> None:
    files = CardFiles(tmp_path)
    told: list[str] = []
    for outcome in ("failed", "loaded"):
        write_intent(files)
        held = files.try_lock(FME)
        assert held is not None
        quarantine = Quarantine(tmp_path, lambda: told.append("changed"))
        quarantine.take_ownership()
        assert quarantine.reasons[PORT].startswith("image being loaded by another process")
        await asyncio.sleep(0.2)
        assert quarantine.holds(PORT)  # still under way: still Unhealthy

        def end(record: CardRecord, outcome: str = outcome) -> None:
            record.intent = None
            if outcome == "failed":
                record.quarantined[PORT] = "load failed: PR failed; its state is unknown"

        files.update(FME, end)
        held.release()
        for _ in range(100):
            if not quarantine.reasons.get(PORT, "").startswith("image being loaded"):
                break
            await asyncio.sleep(0.05)
        if outcome == "failed":
            assert quarantine.reasons[PORT] == "load failed: PR failed; its state is unknown"
        else:
            assert not quarantine.holds(PORT)
        files.update(FME, lambda r: r.quarantined.clear())
    assert told


async def test_the_single_file_of_earlier_releases_is_moved_into_the_records(
        tmp_path: Path) -> None:
    reason = "load failed: loading x failed at fpgaconf: boom; its state is unknown"
    (tmp_path / FILE_NAME).write_text(json.dumps({"devices": {PORT: reason, "gone": reason}}))
    quarantine = Quarantine(tmp_path)
    assert quarantine.holds(PORT)  # read at once, before anything else
    quarantine.take_ownership()
    marked = quarantine.apply(DeviceSet.of([port()]))
    assert not marked.get(PORT).healthy
    assert not (tmp_path / FILE_NAME).exists()
    assert CardFiles(tmp_path).read(FME).quarantined == {PORT: reason}
    assert Quarantine(tmp_path).reasons == {PORT: reason}  # a restart reads the record
