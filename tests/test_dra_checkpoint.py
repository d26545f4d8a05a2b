"""The DRA driver's claim checkpoint: atomic, survives a restart, refuses a damaged file."""

from __future__ import annotations

import asyncio
import json
import logging
import os

import pytest

from plugin.serving.dra import checkpoint as checkpoint_module
from plugin.serving.dra import checkpoint_format
from plugin.serving.dra.checkpoint import CheckpointError, CheckpointUnavailable, ClaimCheckpoint
from plugin.serving.dra.prepared import PreparedClaim
from plugin.version import VERSION
from value_types.claims import ClaimRef, PreparedDevice


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


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_the_file_is_versioned_and_leaves_no_temporary_file_behind(path):
    record = ClaimCheckpoint(path)
    await record.commit(put=[claim("u1")])
    header, first = lines(path)
    assert header == {"kind": checkpoint_format.KIND, "version": checkpoint_format.FORMAT_VERSION,
                      "minor": checkpoint_format.FORMAT_MINOR, "writtenBy": VERSION}
    assert first["checksum"].startswith("sha256:")
    assert first["record"]["put"]["u1"]["devices"][0]["pool"] == "node-1"
    assert sorted(p.name for p in path.parent.iterdir()) == ["checkpoint.json"]
    assert oct(path.stat().st_mode & 0o777) == "0o600"


async def test_a_change_is_one_line_added_not_the_record_rewritten(path):
    """What keeps prepare cheap: the file grows by one line per change; the claims already
    recorded are not written again."""
    record = ClaimCheckpoint(path)
    await record.commit(put=[claim("u1"), claim("u2")])
    before = path.read_bytes()
    await record.commit(put=[claim("u3")])
    await record.commit(remove=["u1"])
    after = path.read_bytes()
    assert after.startswith(before), "the lines written before are left as they were"
    added = [json.loads(line) for line in after[len(before):].splitlines()]
    assert [a["record"]["seq"] for a in added] == [2, 3]
    assert list(added[0]["record"]["put"]) == ["u3"] and added[1]["record"]["remove"] == ["u1"]
    assert record.rewrites == 1 and record.writes == 3
    assert list(ClaimCheckpoint(path)) == ["u2", "u3"]


async def test_the_journal_is_compacted_once_it_outgrows_the_claims(path, monkeypatch):
    monkeypatch.setattr(checkpoint_module, "COMPACT_AFTER", 4)
    record = ClaimCheckpoint(path)
    for n in range(10):
        await record.commit(put=[claim(f"u{n}")])
        await record.commit(remove=[f"u{n - 1}"])
    assert len(lines(path)) <= 1 + 4, "rewritten whole, not grown without end"
    assert record.rewrites > 1
    assert list(ClaimCheckpoint(path)) == ["u9"]


async def test_many_claims_are_not_rewritten_on_every_change(path, monkeypatch):
    """With more claims than COMPACT_AFTER, a rewrite waits for as many lines as claims:
    each change costs O(1) on average, never O(claims)."""
    monkeypatch.setattr(checkpoint_module, "COMPACT_AFTER", 4)
    record = ClaimCheckpoint(path)
    await record.commit(put=[claim(f"held{n}") for n in range(20)])
    for n in range(10):
        await record.commit(put=[claim(f"u{n}")])
        await record.commit(remove=[f"u{n}"])
    assert record.rewrites == 1 and len(lines(path)) == 1 + 21
    await record.commit(put=[claim("u10")])
    assert record.rewrites == 2 and len(lines(path)) == 2
    assert len(ClaimCheckpoint(path)) == 21


async def test_what_a_power_cut_can_leave_at_the_end_is_dropped_and_then_rewritten(
        path, caplog):
    """No fsync: a power cut may cut the last lines short or leave zeros. Those changes are
    lost (so are the containers); the good lines before them still count, and the next
    change rewrites the file so that the damage never ends up in the middle."""
    record = ClaimCheckpoint(path)
    await record.commit(put=[claim("u1")])
    await record.commit(put=[claim("u2")])
    good = path.read_bytes()
    await record.commit(put=[claim("u3")])
    whole = path.read_bytes()
    last = whole[len(good):]
    for tail in (last[: len(last) // 2], last[:-1], b"\x00" * 300, b"\x00" * 40 + b"\n",
                 last[:20] + b"\x00" * 30 + b"\n" + last[50:-1]):
        path.write_bytes(good + tail)
        with caplog.at_level(logging.WARNING):
            restarted = ClaimCheckpoint(path)
        assert list(restarted) == ["u1", "u2"], tail
        assert "damaged line" in caplog.text
        await restarted.commit(put=[claim("u4")])
        assert restarted.rewrites == 1, "rewritten, not appended after the damage"
        assert list(ClaimCheckpoint(path)) == ["u1", "u2", "u4"]
        caplog.clear()


async def test_what_a_power_cut_can_leave_of_a_new_file_is_set_aside_not_trusted(path, caplog):
    checkpoint = ClaimCheckpoint(path)
    await checkpoint.commit(put=[claim("u1"), claim("u2")])
    header = path.read_bytes().split(b"\n")[0]
    for damaged in (b"", header[: len(header) // 2], b"\x00" * 64):
        path.write_bytes(damaged)
        assert len(ClaimCheckpoint(path)) == 0
        assert not path.exists(), "set aside for a person to read"
    assert "unusable" in caplog.text


@pytest.mark.parametrize("damage", ["edited", "lost", "swapped"])
async def test_damage_before_a_good_line_is_not_a_power_cut_and_is_refused(
        path, caplog, damage):
    record = ClaimCheckpoint(path)
    for n in range(4):
        await record.commit(put=[claim(f"u{n}")])
    header, *changes = path.read_text().splitlines(keepends=True)
    if damage == "edited":
        changes[1] = changes[1].replace("fpga-0", "fpga-9")
    elif damage == "lost":
        del changes[1]
    else:
        changes[1], changes[2] = changes[2], changes[1]
    path.write_text(header + "".join(changes))
    with caplog.at_level(logging.ERROR):
        assert len(ClaimCheckpoint(path)) == 0
    assert "unusable" in caplog.text and "line 3" in caplog.text
    assert not path.exists()


async def test_nothing_to_change_writes_nothing(path):
    record = ClaimCheckpoint(path)
    await record.commit(remove=["unknown"])
    assert record.writes == 0 and not path.exists()


async def test_a_failed_rewrite_changes_neither_the_file_nor_memory(path, monkeypatch):
    record = ClaimCheckpoint(path)

    def refuse(*_args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(CheckpointError, match="No space left on device"):
        await record.commit(put=[claim("u1")])
    assert list(record) == [] and not path.exists()
    assert list(path.parent.iterdir()) == [], "no temporary file left"
    monkeypatch.undo()
    await record.commit(put=[claim("u1")])
    assert list(ClaimCheckpoint(path)) == ["u1"]


@pytest.mark.parametrize("truncate_fails", [False, True])
async def test_a_line_written_short_is_cut_off_or_the_file_rewritten_next(
        path, monkeypatch, truncate_fails):
    record = ClaimCheckpoint(path)
    await record.commit(put=[claim("u1")])
    before = path.read_bytes()
    real_write = os.write

    def half(fd, data):
        return real_write(fd, data[: len(data) // 2])

    monkeypatch.setattr(checkpoint_module.os, "write", half)
    if truncate_fails:
        monkeypatch.setattr(checkpoint_module.os, "ftruncate", lambda *_: (_ for _ in ()).throw(
            OSError(5, "Input/output error")))
    with pytest.raises(CheckpointError, match="written short"):
        await record.commit(put=[claim("u2")])
    assert list(record) == ["u1"], "memory unchanged"
    if not truncate_fails:
        assert path.read_bytes() == before, "the half line is cut off again"
    monkeypatch.undo()
    await record.commit(put=[claim("u3")])
    assert list(ClaimCheckpoint(path)) == ["u1", "u3"], "no half line left in the middle"
    assert record.rewrites == (2 if truncate_fails else 1)


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
    path.write_text(path.read_text().replace("fpga-0", "fpga-9"))
    with caplog.at_level(logging.ERROR):
        assert len(ClaimCheckpoint(path)) == 0
    assert "line 2: checksum mismatch" in caplog.text


@pytest.mark.parametrize("version", [1, 0, "3", True, None])
async def test_a_format_no_release_wrote_is_damage_set_aside(path, caplog, version):
    """Older than any release wrote, or no count at all: no release can read it, so it is
    damage (set aside, empty record), not a newer release's record to keep."""
    await ClaimCheckpoint(path).commit(put=[claim("u1")])
    header, rest = path.read_text().split("\n", 1)
    path.write_text(header.replace(f'"version":{checkpoint_format.FORMAT_VERSION}',
                                   f'"version":{json.dumps(version)}') + "\n" + rest)
    with caplog.at_level(logging.ERROR):
        assert len(ClaimCheckpoint(path)) == 0
    assert f"format version {version!r}" in caplog.text or \
        f"format version {version}" in caplog.text
    assert not path.exists()


def record_line(seq, put, remove=(), inside=None, **extra):
    """A change line as some release writes it: ``inside`` the record and ``extra`` beside it
    fields this one does not know."""
    record = {"put": put, "remove": list(remove), "seq": seq, **(inside or {})}
    digest = checkpoint_format.checksum(checkpoint_format.canonical(record))
    return json.dumps({"checksum": digest, "record": record, **extra}) + "\n"


def header_line(**fields):
    return json.dumps({"kind": checkpoint_format.KIND, **fields}) + "\n"


def next_release_claim(name):
    """A claim as a later release of format 2 might write it: fields this one does not know
    in the claim and in each device (with non-ASCII text, which the checksum must cover)."""
    return {"namespace": "ns", "name": name, "claimSpec": f"b-com.com_claim_{name}.json",
            "statusWritten": {"generation": 7, "note": "prêt"},
            "devices": [{"pool": "node-1", "device": "fpga-0", "deviceID": "0000:5e:00.0",
                         "requests": ["accel"], "cdiDeviceIDs": ["b-com.com/accelerator=x"],
                         "numaNode": 1, "health": {"since": 1.5e9}}]}


async def test_the_next_releases_fields_are_verified_and_ignored_at_every_level(path, caplog):
    """Header, around the record, in the record, in a claim, in a device: fields this
    release does not know are read past, and the line's checksum still verifies (it covers
    the record as written, unknown fields included)."""
    path.parent.mkdir(parents=True)
    path.write_text(
        header_line(version=checkpoint_format.FORMAT_VERSION, minor=7, writtenBy="9.9.9",
                    compaction={"policy": "later"})
        + record_line(1, {"u1": next_release_claim("c1"), "u2": next_release_claim("c2")},
                      origin="prepare")
        + record_line(2, {}, ["u2"], inside={"reason": "unprepare"}, signedBy="node-a"))
    before = path.read_bytes()
    with caplog.at_level(logging.INFO, logger="plugin.serving.dra.checkpoint"):
        record = ClaimCheckpoint(path)
    assert list(record) == ["u1"]
    kept = record.get("u1")
    assert kept.claim_spec == "b-com.com_claim_c1.json"
    assert kept.devices[0].device_id == "0000:5e:00.0" and kept.devices[0].requests == ("accel",)
    assert "format 2.7 (written by release 9.9.9)" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert path.read_bytes() == before, "reading writes nothing"

    await record.commit(remove=["u1"])  # appended to the newer release's file
    assert len(ClaimCheckpoint(path)) == 0


async def test_an_unknown_field_added_behind_the_checksums_back_is_damage(path, caplog):
    """Tolerance of unknown fields is no hole in the checksum: one added to a record after
    its checksum was made is refused like any other edit."""
    await ClaimCheckpoint(path).commit(put=[claim("u1")])
    path.write_text(path.read_text().replace('"seq":1', '"seq":1,"extra":true'))
    with caplog.at_level(logging.ERROR):
        assert len(ClaimCheckpoint(path)) == 0
    assert "line 2: checksum mismatch" in caplog.text


async def newer_major(path):
    """A record of claim u1 as a release with the next major format might leave it."""
    await ClaimCheckpoint(path).commit(put=[claim("u1")])
    rest = path.read_text().split("\n", 1)[1]
    newer = max(checkpoint_format.READ_VERSIONS) + 1
    path.write_text(header_line(version=newer, minor=0, writtenBy="0.3.0") + rest)
    return newer


async def test_a_newer_major_format_is_refused_loudly_and_left_untouched(path, caplog):
    newer = await newer_major(path)
    before = path.read_bytes()
    with caplog.at_level(logging.ERROR, logger="plugin.serving.dra.checkpoint"):
        record = ClaimCheckpoint(path)
        reason = record.unavailable()
        for _ in range(3):  # every call reads again, and says it once
            assert record.unavailable() == reason
        with pytest.raises(CheckpointUnavailable):
            record.get("u1")
        with pytest.raises(CheckpointUnavailable):
            await record.commit(put=[claim("u2")])
        with pytest.raises(CheckpointUnavailable):
            await record.commit(remove=["u1"])
    assert reason == (f"format version {newer}, written by release 0.3.0; this driver "
                      f"(release {VERSION}) reads format versions 2 and 3")
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and reason in errors[0], errors
    assert record.held() is None, "no count while it cannot be read"
    assert path.read_bytes() == before, "never written over"
    assert sorted(p.name for p in path.parent.iterdir()) == ["checkpoint.json"], "never renamed"

    # the release that reads it is back (here: the header of this one): read at the next call
    rest = path.read_text().split("\n", 1)[1]
    path.write_text(checkpoint_format.header_line() + rest)
    with caplog.at_level(logging.WARNING, logger="plugin.serving.dra.checkpoint"):
        assert record.unavailable() is None
    assert "can be read again" in caplog.text
    assert list(record) == ["u1"] and record.held() == 1
    await record.commit(remove=["u1"])
    assert len(ClaimCheckpoint(path)) == 0


async def test_an_entry_of_the_wrong_shape_is_refused(path, caplog):
    record = {"put": {"u1": {"namespace": "ns", "name": "c", "devices": [{"pool": 3}]}},
              "remove": [], "seq": 1}
    digest = checkpoint_format.checksum(checkpoint_format.canonical(record))
    path.parent.mkdir(parents=True)
    path.write_text(checkpoint_format.header_line()
                    + json.dumps({"checksum": digest, "record": record}) + "\n")
    with caplog.at_level(logging.ERROR):
        assert len(ClaimCheckpoint(path)) == 0
    assert "'pool' is not text" in caplog.text


def test_an_unreadable_file_is_left_alone_and_nothing_answered_from_it(path, caplog):
    """Unreadable is not corrupt: the claims it holds are still held, so nothing is answered
    (or written) until it can be read."""
    path.mkdir(parents=True)  # a directory where the file should be: read fails, not corrupt
    with caplog.at_level(logging.ERROR):
        record = ClaimCheckpoint(path)
        assert record.unavailable() == "cannot read it: Is a directory"
        with pytest.raises(CheckpointUnavailable):
            len(record)
    assert path.is_dir() and "cannot read" in caplog.text
    path.rmdir()
    assert record.unavailable() is None and len(record) == 0


def _pinned_claim() -> PreparedClaim:
    from plugin.programming.function_config import parse_function
    from plugin.programming.outcome import LOADED, Outcome

    driver = "accelerator.b-com.com"
    spec = parse_function(driver, {
        "apiVersion": f"{driver}/v1alpha1", "kind": "FpgaFunction",
        "afuID": "d8424dc4-a4a3-c413-f89e-433683f9040b", "image": "nlb0.gbs",
        "sha256": "ab" * 32,
        "clearOnUnprepare": {"afuID": "d8424dc4-a4a3-c413-f89e-433683f9040b",
                             "image": "blank.gbs", "sha256": "cd" * 32}},
        "DeviceClass configuration 0", from_class=True)
    device = PreparedDevice("node-1", "fpga-0", "0000:5e:00.0", ("fpga",), ())
    return PreparedClaim(ClaimRef("ns", "c", "uid-1"), (device,), None,
                         (Outcome("0000:5e:00.0", spec, LOADED, "ioctl", 1.5, "ab" * 32),))


def test_the_digests_of_a_claims_functions_survive_a_restart(tmp_path) -> None:
    path = tmp_path / "claims.jsonl"
    claim = _pinned_claim()
    asyncio.run(ClaimCheckpoint(path).commit(put=[claim]))
    again = ClaimCheckpoint(path).get("uid-1")
    assert again == claim
    outcome = again.functions[0]
    assert (outcome.sha256, outcome.spec.sha256, outcome.spec.clear.sha256) == (
        "ab" * 32, "ab" * 32, "cd" * 32)


def test_a_claims_functions_carry_only_the_keys_the_release_before_reads() -> None:
    """0.2.0 builds each function from every key it finds (an unknown one costs the claim
    its functions there): the digests go beside them, in ``functionDigests``."""
    written = _pinned_claim().to_json()
    [function] = written["functions"]
    assert set(function) == {"device_id", "spec", "result", "loader", "seconds"}
    assert set(function["spec"]) == {"family", "field", "function_id", "image", "where",
                                     "clear"}
    assert set(function["spec"]["clear"]) == {"family", "field", "function_id", "image",
                                              "where", "clear"}
    assert written["functionDigests"] == [{"deviceID": "0000:5e:00.0", "loaded": "ab" * 32,
                                           "pinned": "ab" * 32, "clearPinned": "cd" * 32}]


# -- shares: major format 3 while one is recorded ---------------------------------------------

SHARE = "5f0c2a9e-3b1d-4c7e-8a6f-2d9e1b7c4a30"


def share(uid, contexts=1, share_id=SHARE, device="fpga-0", device_id="0000:5e:00.0"):
    return claim(uid, PreparedDevice("node-1", device, device_id, ("accel",),
                                     (f"b-com.com/accelerator={device}",), share_id, contexts))


def header_version(path):
    return json.loads(path.read_text().split("\n", 1)[0])["version"]


async def test_the_first_share_raises_the_file_to_format_3_and_the_last_one_gone_rewrites_2(path):
    record = ClaimCheckpoint(path)
    await record.commit(put=[claim("whole")])
    assert header_version(path) == 2 and record.format_version == 2
    inode, before = path.stat().st_ino, path.read_bytes()[path.read_bytes().index(b"\n"):]
    await record.commit(put=[share("s1", 2)])
    assert header_version(path) == 3 and record.rewrites == 1, "header raised, not rewritten"
    assert path.stat().st_ino == inode and path.read_bytes().count(before) == 1, "line added"

    before = path.read_bytes()
    await record.commit(put=[share("s2", 1, "9a7b3c2d-1e0f-4a5b-8c6d-7e8f9a0b1c2d")])
    await record.commit(remove=["s1"])
    assert path.read_bytes().startswith(before) and record.rewrites == 1, \
        "while a share stays the file stays format 3 and grows by lines"
    assert header_version(path) == 3

    await record.commit(remove=["s2"])
    assert header_version(path) == 2 and record.rewrites == 2, "no share line left to replay"
    assert list(ClaimCheckpoint(path)) == ["whole"]
    before = path.read_bytes()
    await record.commit(put=[claim("whole-2")])
    assert path.read_bytes().startswith(before), "format 2 again: appended as before"


async def test_a_share_is_read_back_by_the_next_start_with_its_id_and_contexts(path):
    await ClaimCheckpoint(path).commit(put=[share("s1", 3), claim("whole")])
    restarted = ClaimCheckpoint(path)
    assert restarted.format_version == 3
    [device] = restarted.get("s1").devices
    assert (device.share_id, device.contexts) == (SHARE, 3)
    assert restarted.get("whole").devices[0].share_id is None
    written = lines(path)[1]["record"]["put"]
    assert "shareID" not in written["whole"]["devices"][0], "written only for shares"
    assert written["s1"]["devices"][0]["shareID"] == SHARE

    await restarted.commit(remove=["s1"])  # the restarted record knows s1 was the last share
    assert header_version(path) == 2


async def test_what_the_claims_hold_of_each_device_for_publishing(path):
    record = ClaimCheckpoint(path, load=False)
    assert record.device_holdings() is None, "never read for the asking"
    record.load()
    await record.commit(put=[
        claim("whole", PreparedDevice("node-1", "fpga-1", "0000:5e:00.1", ("a",), ())),
        share("s1", 2), share("s2", 1, "9a7b3c2d-1e0f-4a5b-8c6d-7e8f9a0b1c2d")])
    holdings = record.device_holdings()
    assert holdings.whole == {"0000:5e:00.1"}
    assert dict(holdings.shared) == {"0000:5e:00.0": 3}
    assert holdings.holders["0000:5e:00.0"] == ("ns/claim-s1 (s1)", "ns/claim-s2 (s2)")


def release_reader(commit: str):
    """``checkpoint_format`` as it was at ``commit``, taken from git history (its claim and
    device records are read by this tree's types: what is tested is its header check)."""
    import importlib.util
    import subprocess
    import sys
    from pathlib import Path

    from tests.system_tools import GIT, needs_tool

    git = needs_tool("git", GIT)
    root = Path(__file__).resolve().parent.parent
    found = subprocess.run([git, "-C", str(root), "show",
                            f"{commit}:plugin/serving/dra/checkpoint_format.py"],
                           capture_output=True, text=True)
    if found.returncode != 0:
        pytest.skip(f"commit {commit[:7]} is not in this repository's history: "
                    f"{found.stderr.strip()}")
    spec = importlib.util.spec_from_loader(f"checkpoint_format_{commit[:7]}", loader=None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    try:
        exec(compile(found.stdout, f"{commit[:7]}:checkpoint_format.py", "exec"),
             module.__dict__)
    finally:
        del sys.modules[spec.name]
    return module


BEFORE_SHARES = "dd8b628cfb50c4bcccdc1a77b5c7c94ca816a07e"
"""The last commit whose checkpoint reader knew no shares (what 0.2.0 reads)."""


async def test_a_release_that_reads_only_format_2_refuses_a_share_and_reads_the_rest(path):
    reader = release_reader(BEFORE_SHARES)
    assert reader.FORMAT_VERSION == 2
    record = ClaimCheckpoint(path)
    await record.commit(put=[claim("whole"), share("s1", 2)])
    with pytest.raises(reader.NewerFormat, match=(
            f"^format version 3, written by release {VERSION}; this driver "
            r"\(release .*\) reads format version 2$")):
        reader.decode(path.read_bytes())

    await record.commit(remove=["s1"])
    assert list(reader.decode(path.read_bytes()).claims) == ["whole"], \
        "without a share the file is format 2 again: a rollback reads it"
