"""The first share recorded raises the checkpoint's header to format 3 in place.

A whole rewrite of the file (a temporary file renamed over it) cost the node's first share
about 1.5 ms more than any other prepare on a loaded machine (``python -m bench sharing``);
one byte of the header changed in place, then the share's line appended, costs what any line
does. What must hold still: a release that reads only format 2 refuses the file while the
share is recorded, this release reads every claim, and a failure at any step leaves the file
either readable as it was or in format 3 with no share (which only a release before shares
minds, until the next change rewrites it), never a share under a format 2 header.
"""

from __future__ import annotations

import json

import pytest

from plugin.serving.dra import checkpoint as checkpoint_module
from plugin.serving.dra.checkpoint import CheckpointError, ClaimCheckpoint
from tests.test_dra_checkpoint import (
    BEFORE_SHARES,
    claim,
    header_version,
    release_reader,
    share,
)


@pytest.fixture
def path(tmp_path):
    return tmp_path / "state" / "checkpoint.json"


async def test_the_raised_file_is_refused_by_a_release_before_shares_and_read_whole_by_this_one(
        path):
    reader = release_reader(BEFORE_SHARES)
    record = ClaimCheckpoint(path)
    await record.commit(put=[claim("whole")])
    await record.commit(put=[share("s1", 2)])
    assert record.rewrites == 1, "raised in place, not rewritten"
    with pytest.raises(reader.NewerFormat, match=r"^format version 3, written by release"):
        reader.decode(path.read_bytes())
    restarted = ClaimCheckpoint(path)
    assert restarted.format_version == 3
    assert list(restarted) == ["whole", "s1"]
    assert restarted.get("s1").devices[0].share_id is not None


async def test_a_header_this_release_did_not_write_is_rewritten_whole(path):
    record = ClaimCheckpoint(path)
    await record.commit(put=[claim("whole")])
    header, rest = path.read_text().split("\n", 1)
    older = json.loads(header)
    older["writtenBy"] = "0.2.0-rc1"
    path.write_text(json.dumps(older, separators=(",", ":")) + "\n" + rest)
    record = ClaimCheckpoint(path)
    await record.commit(put=[claim("whole-2")])
    assert record.rewrites == 0, "appended under the older header, as before"

    await record.commit(put=[share("s1", 2)])
    assert record.rewrites == 1, "never raise a header that is not this release's own"
    assert header_version(path) == 3
    assert json.loads(path.read_text().split("\n", 1)[0])["writtenBy"] != "0.2.0-rc1"
    assert sorted(ClaimCheckpoint(path)) == ["s1", "whole", "whole-2"]


async def test_a_share_line_not_written_after_the_raise_leaves_format_3_then_2(
        path, monkeypatch):
    record = ClaimCheckpoint(path)
    await record.commit(put=[claim("whole")])

    def full(fd, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint_module.os, "write", full)  # the line's; the byte is pwrite
    with pytest.raises(CheckpointError, match="No space left"):
        await record.commit(put=[share("s1", 2)])
    monkeypatch.undo()
    assert list(record) == ["whole"], "memory unchanged"
    assert header_version(path) == 3, "the safe side: refused by 0.2.0, no share misread"
    assert list(ClaimCheckpoint(path)) == ["whole"]

    await record.commit(put=[claim("whole-2")])
    assert header_version(path) == 2, "no share: rewritten as format 2 at the next change"
    assert list(ClaimCheckpoint(path)) == ["whole", "whole-2"]
