"""Each seal on the in-memory copy a vendor tool reads, checked on its own.

:func:`~plugin.programming.loaders.sealed.sealed_copy` promises the tool reads exactly the
bytes that were hashed and checked. That rests on four seals (fcntl(2) file sealing); with
any one missing, a process holding the copy's descriptor (the tool itself, or whatever it
runs) could change what is loaded after the check. Each test reads the seal set the kernel
reports (``F_GET_SEALS``) and makes the change that seal forbids.
"""

from __future__ import annotations

import fcntl
import mmap
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from plugin.programming.library import ImageLibrary
from plugin.programming.loaders.base import LoadJob
from plugin.programming.loaders.sealed import SealedImage, sealed_copy
from value_types.devices import Device

CONTENT = b"\x5a" * 4096 + b"end"


@pytest.fixture
def job(tmp_path: Path) -> LoadJob:
    root = tmp_path / "images"
    root.mkdir()
    (root / "image.bin").write_bytes(CONTENT)
    return LoadJob(Device("0000:5e:00.0", "intel"), "00" * 16, ImageLibrary(root),
                   "image.bin")


def write_in_place(image: SealedImage) -> None:
    os.pwrite(image.fd, b"other bytes", 0)


def write_through_a_mapping(image: SealedImage) -> None:
    mmap.mmap(image.fd, image.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)


def shrink(image: SealedImage) -> None:
    os.ftruncate(image.fd, image.size - 1)


def grow(image: SealedImage) -> None:
    os.ftruncate(image.fd, image.size + 4096)


def unseal(image: SealedImage) -> None:
    fcntl.fcntl(image.fd, fcntl.F_ADD_SEALS, 0)  # any change of the seal set


@pytest.mark.parametrize(("seal", "change"), [
    (fcntl.F_SEAL_WRITE, write_in_place),
    (fcntl.F_SEAL_WRITE, write_through_a_mapping),
    (fcntl.F_SEAL_SHRINK, shrink),
    (fcntl.F_SEAL_GROW, grow),
    (fcntl.F_SEAL_SEAL, unseal),
], ids=["write", "write-mapped", "shrink", "grow", "seal"])
def test_the_copy_holds_the_seal_and_refuses_its_change(
        job: LoadJob, seal: int, change: Callable[[SealedImage], None]) -> None:
    with sealed_copy(job) as image:
        assert fcntl.fcntl(image.fd, fcntl.F_GET_SEALS) & seal == seal
        with pytest.raises(PermissionError):
            change(image)
        assert os.fstat(image.fd).st_size == len(CONTENT)
        with image.stream() as stream:
            assert stream.read() == CONTENT
