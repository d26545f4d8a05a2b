"""The driver's load records as the sharing decision reads them: from memory until the file
changes, never stale after a load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from plugin.programming import load_record
from plugin.programming.load_record import FILE_NAME, LoadRecord, LoadRecords


def record(function_id: str) -> LoadRecord:
    return LoadRecord(function_id=function_id, function=f"xclbinUUID {function_id}",
                      image="a.xclbin", sha256=None, claim="default/c (u1)",
                      at="2026-11-27T00:00:00Z")


def test_records_are_read_once_until_the_file_changes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    records = LoadRecords(tmp_path)
    records.loaded("card-0", record("aa"))
    reads: list[Path] = []
    real = load_record.read_records

    def counted(state_dir: Path) -> dict[str, LoadRecord]:
        reads.append(state_dir)
        return real(state_dir)

    monkeypatch.setattr(load_record, "read_records", counted)
    first = records.current()
    assert first["card-0"].function_id == "aa"
    for _ in range(5):
        assert records.current() is first
    assert len(reads) == 1, "an unchanged file is not read again"
    records.loaded("card-0", record("bb"))  # a new load replaces the file
    assert records.current()["card-0"].function_id == "bb"


def test_a_file_replaced_by_another_writer_is_read_again(tmp_path: Path) -> None:
    records = LoadRecords(tmp_path)
    records.loaded("card-0", record("aa"))
    assert records.current()["card-0"].function_id == "aa"
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"devices": {"card-1": vars(record("cc"))}}))
    other.replace(tmp_path / FILE_NAME)
    assert set(records.current()) == {"card-1"}
    (tmp_path / FILE_NAME).unlink()
    assert dict(records.current()) == {}
    assert dict(LoadRecords(None).current()) == {}
