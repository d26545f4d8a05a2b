"""Health files kept open between scans: changes in place are seen, nothing blocks, no leaks."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from plugin.discovery.backends import rereads
from plugin.discovery.backends.rereads import KeptFiles


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_change_in_place_is_seen_and_an_unchanged_file_is_not(tmp_path: Path) -> None:
    afu_id, errors = tmp_path / "afu_id", tmp_path / "errors"
    afu_id.write_text("d8424dc4a4a3c413f89e433683f9040b\n")
    errors.write_text("0x0\n")
    kept = KeptFiles()
    kept.reset([afu_id, errors])
    assert kept.last == (b"d8424dc4a4a3c413f89e433683f9040b\n", b"0x0\n")
    assert not kept.changed()
    errors.write_text("0x4\n")  # written in place, as the kernel changes an attribute
    assert kept.changed() and kept.last[1] == b"0x4\n"
    assert not kept.changed()
    kept.close()


def test_files_that_are_not_attributes_are_re_read_by_path_and_never_block(
    tmp_path: Path,
) -> None:
    fifo, missing, huge = tmp_path / "fifo", tmp_path / "missing", tmp_path / "huge"
    os.mkfifo(fifo)
    huge.write_bytes(b"f" * 100_000)
    kept = KeptFiles()
    kept.reset([fifo, missing, huge])
    assert kept.last == (None, None, None)
    fifo.unlink()
    fifo.write_text("1\n")  # the FIFO became an attribute: seen without a rescan
    missing.write_text("0\n")
    assert kept.changed() and kept.last == (b"1\n", b"0\n", None)
    kept.close()


def test_a_socket_is_not_kept_open(tmp_path: Path) -> None:
    path = Path("/tmp") / f"kept-{os.getpid()}.sock"
    with socket.socket(socket.AF_UNIX) as bound:
        bound.bind(str(path))
        try:
            kept = KeptFiles()
            kept.reset([path])
            assert kept.last == (None,)
            kept.close()
        finally:
            path.unlink()


def test_a_replaced_file_is_seen_at_the_next_reset(tmp_path: Path) -> None:
    """sysfs never replaces an attribute; a damaged tree may, and the next scan catches it."""
    afu_id = tmp_path / "afu_id"
    afu_id.write_text("one\n")
    kept = KeptFiles()
    kept.reset([afu_id])
    afu_id.unlink()
    os.mkfifo(afu_id)
    kept.reset([afu_id])
    assert kept.last == (None,)
    kept.close()


def test_descriptors_are_closed_on_every_reset_and_bounded(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(rereads, "MAX_KEPT_OPEN", 4)
    files = []
    for n in range(10):
        files.append(tmp_path / f"f{n}")
        files[-1].write_text(f"{n}\n")
    before = open_fds()
    kept = KeptFiles()
    for _ in range(50):
        kept.reset(files)
        assert open_fds() == before + 4, "four kept open, the rest read by path"
    assert kept.last == tuple(f"{n}\n".encode() for n in range(10))
    files[9].write_text("changed\n")  # one of those read by path
    assert kept.changed()
    kept.close()
    assert open_fds() == before
