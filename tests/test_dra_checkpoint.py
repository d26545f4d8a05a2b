"""The DRA driver's claim checkpoint: atomic, survives a restart, refuses a damaged file."""

from __future__ import annotations

import asyncio
import json
import logging
import os

import pytest

from plugin.serving.dra import checkpoint as checkpoint_module
from plugin.serving.dra.checkpoint import CheckpointError, ClaimCheckpoint
from plugin.serving.dra.claims_model import ClaimRef
from plugin.serving.dra.prepared import PreparedClaim, PreparedDevice


def claim(uid, *devices, spec=None):
    devices = devices or (PreparedDevice("node-1", "fpga-0", "0000:5e:00.0", ("accel/large",),
                                         ("b-com.com/accelerator=0000-5e-00.0",)),)
    return PreparedClaim(ClaimRef("ns", f"claim-{uid}", uid), tuple(devices), spec)


@pytest.fixture
def path(tmp_path):
    return tmp_path / "state" / "checkpoint.json"


def test_a_missing_file_is_an_empty_record_and_nothing_is_written(path):
    record = ClaimCheckpoint(path)
    assert len(record) == 0 and record.get("u1") is None
    assert not path.exists()


async def test_a_commit_is_on_disk_and_read_back_by_the_next_start(path):
    record = ClaimCheckpoint(path)
    first = claim("u1", spec="b-com.com_claim_u1.json")
    await record.commit(put=[first, claim("u2")])
    assert record.get("u1") == first and "u2" in record and record.writes == 1

    restarted = ClaimCheckpoint(path)
    assert dict(restarted.claims) == dict(record.claims)
    assert restarted.get("u1").devices[0].requests == ("accel/large",)
    assert restarted.get("u1").claim_spec == "b-com.com_claim_u1.json"

    await restarted.commit(remove=["u1", "never-there"])
    assert list(ClaimCheckpoint(path)) == ["u2"]


async def test_the_file_is_versioned_and_leaves_no_temporary_file_behind(path):
    record = ClaimCheckpoint(path)
    await record.commit(put=[claim("u1")])
    document = json.loads(path.read_text())
    assert document["version"] == checkpoint_module.FORMAT_VERSION
    assert document["checksum"].startswith("sha256:")
    assert document["claims"]["u1"]["devices"][0]["pool"] == "node-1"
    assert sorted(p.name for p in path.parent.iterdir()) == ["checkpoint.json"]
    assert oct(path.stat().st_mode & 0o777) == "0o600"


async def test_what_a_power_cut_can_leave_is_set_aside_not_trusted(path, caplog):
    """No fsync: a power cut may leave the renamed file empty or short; it must read as a
    damaged record (set aside, nothing prepared), never as a good one."""
    checkpoint = ClaimCheckpoint(path)
    await checkpoint.commit(put=[claim("u1"), claim("u2")])
    whole = path.read_bytes()
    for damaged in (b"", whole[: len(whole) // 2]):
        path.write_bytes(damaged)
        assert len(ClaimCheckpoint(path)) == 0
        assert not path.exists(), "set aside for a person to read"
    assert "corrupt" in caplog.text or "set aside" in caplog.text


async def test_nothing_to_change_writes_nothing(path):
    record = ClaimCheckpoint(path)
    await record.commit(remove=["unknown"])
    assert record.writes == 0 and not path.exists()


async def test_a_failed_write_changes_neither_the_file_nor_memory(path, monkeypatch):
    record = ClaimCheckpoint(path)
    await record.commit(put=[claim("u1")])
    before = path.read_bytes()

    def refuse(*_args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(CheckpointError, match="No space left on device"):
        await record.commit(put=[claim("u2")], remove=["u1"])
    assert path.read_bytes() == before
    assert list(record) == ["u1"]
    assert sorted(p.name for p in path.parent.iterdir()) == ["checkpoint.json"]


async def test_a_commit_whose_caller_is_cancelled_still_completes(path, monkeypatch):
    record = ClaimCheckpoint(path)
    started = asyncio.Event()
    real = checkpoint_module._write_atomically

    def slow(target, text):
        started.set()
        import time
        time.sleep(0.1)
        real(target, text)

    monkeypatch.setattr(checkpoint_module, "_write_atomically", slow)
    caller = asyncio.create_task(record.commit(put=[claim("u1")]))
    await started.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    for _ in range(50):
        if "u1" in record:
            break
        await asyncio.sleep(0.02)
    assert "u1" in record and "u1" in ClaimCheckpoint(path), "memory and file agree"


async def test_concurrent_commits_are_serialised_and_none_is_lost(path):
    record = ClaimCheckpoint(path)
    await asyncio.gather(*(record.commit(put=[claim(f"u{i}")]) for i in range(20)))
    assert len(ClaimCheckpoint(path)) == 20 and record.writes == 20


@pytest.mark.parametrize("damage", [
    b"{not json",
    b"\xff\xfe",
    b"[]",
    b'{"kind": "Something", "version": 1, "claims": {}}',
])
def test_a_corrupt_file_is_set_aside_logged_once_and_the_driver_starts_empty(
        path, caplog, damage):
    path.parent.mkdir(parents=True)
    path.write_bytes(damage)
    with caplog.at_level(logging.ERROR, logger="plugin.serving.dra.checkpoint"):
        record = ClaimCheckpoint(path)
    assert len(record) == 0
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "unusable" in errors[0].getMessage()
    kept = [p for p in path.parent.iterdir() if p.name.startswith("checkpoint.json.corrupt-")]
    assert len(kept) == 1 and kept[0].read_bytes() == damage, "a copy is kept for a person"
    assert not path.exists()


async def test_a_file_edited_behind_the_drivers_back_fails_its_checksum(path, caplog):
    await ClaimCheckpoint(path).commit(put=[claim("u1")])
    document = json.loads(path.read_text())
    document["claims"]["u1"]["devices"][0]["device"] = "fpga-9"
    path.write_text(json.dumps(document))
    with caplog.at_level(logging.ERROR):
        assert len(ClaimCheckpoint(path)) == 0
    assert "checksum mismatch" in caplog.text


async def test_a_newer_format_is_refused_not_misread(path, caplog):
    await ClaimCheckpoint(path).commit(put=[claim("u1")])
    document = json.loads(path.read_text())
    document["version"] = 2
    path.write_text(json.dumps(document))
    with caplog.at_level(logging.ERROR):
        assert len(ClaimCheckpoint(path)) == 0
    assert "format version 2" in caplog.text


async def test_an_entry_of_the_wrong_shape_is_refused(path, caplog):
    body = {"u1": {"namespace": "ns", "name": "c", "devices": [{"pool": 3}]}}
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"kind": checkpoint_module.KIND, "version": 1,
                                "checksum": checkpoint_module._checksum(body), "claims": body}))
    with caplog.at_level(logging.ERROR):
        assert len(ClaimCheckpoint(path)) == 0
    assert "'pool' is not text" in caplog.text


def test_an_unreadable_file_is_left_alone(path, caplog):
    path.mkdir(parents=True)  # a directory where the file should be: read fails, not corrupt
    with caplog.at_level(logging.ERROR):
        assert len(ClaimCheckpoint(path)) == 0
    assert path.is_dir() and "cannot read" in caplog.text
