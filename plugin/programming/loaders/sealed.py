"""A library image copied once into sealed memory: the bytes a vendor tool reads are the
bytes that were checked and hashed.

A tool such as ``fpgaconf`` or ``xbutil`` reads its image by path, after this driver checked
it. Handed the library path, a file replaced in between (an admin's ``cp`` over it, a
rolled-out new image) would load bytes nobody checked. So the file is read exactly once,
through the image library (:meth:`ImageLibrary.open`, its containment and size checks), into
an anonymous memory file (``memfd_create(2)``) while it is hashed; the copy is then sealed
against every change (``F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL``,
``fcntl(2)`` file sealing: once ``F_SEAL_WRITE`` is set no process can write it, through any
descriptor or mapping), its header is checked on the copy, and the tool is handed the
copy's descriptor (``pass_fds``) as the path ``/proc/self/fd/N``, which the tool opens like
any file. Nothing the library's directory holds after the copy can reach the card.

The copy lives in the loader's memory (shmem, counted in its container's memory cgroup)
for the length of the load: an image is at most ``--image-max-bytes``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from plugin.model.sha256 import new_sha256
from plugin.programming.digest import CHUNK, DIGEST_STEP, mismatch
from plugin.programming.loaders.base import LoadFailed, LoadJob
from plugin.programming.loaders.checks import CHECK_STEP, image_source

SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


@dataclass(frozen=True)
class SealedImage:
    """The sealed copy open as ``fd`` (``size`` bytes, digest ``sha256``)."""

    fd: int
    size: int
    sha256: str

    @property
    def path(self) -> str:
        """The name a child that inherited ``fd`` at the same number opens it by."""
        return f"/proc/self/fd/{self.fd}"

    @contextlib.contextmanager
    def stream(self) -> Iterator[BinaryIO]:
        """The copy open for reading from offset 0 (its own descriptor: ``fd`` stays
        open and at offset 0 for the tool)."""
        fd = os.open(f"/proc/self/fd/{self.fd}", os.O_RDONLY | os.O_CLOEXEC)
        with os.fdopen(fd, "rb", buffering=0) as stream:
            yield stream


@contextlib.contextmanager
def sealed_copy(job: LoadJob) -> Iterator[SealedImage]:
    """The job's image, copied, hashed and sealed; refused (``touched=False``) when it
    cannot be read or its digest is not the one the job pins."""
    _library, name = image_source(job)
    fd = os.memfd_create(f"image:{name}"[:240], os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        size, digest = _copy(job, fd)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
        if job.sha256 is not None and digest != job.sha256:
            raise LoadFailed(DIGEST_STEP, mismatch(name, job.sha256, digest), touched=False)
        yield SealedImage(fd, size, digest)
    finally:
        os.close(fd)


def _copy(job: LoadJob, fd: int) -> tuple[int, str]:
    library, name = image_source(job)
    hasher = new_sha256()
    done = 0
    try:
        with library.open(name) as (stream, size):
            # One byte past the size seen at open: a file growing meanwhile is caught
            # without reading an unbounded stream.
            while chunk := stream.read(min(CHUNK, size + 1 - done)):
                hasher.update(chunk)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view):]
                done += len(chunk)
    except ValueError as exc:
        raise LoadFailed(CHECK_STEP, f"{job.device.id}: {exc}", touched=False) from None
    except OSError as exc:
        raise LoadFailed(CHECK_STEP, f"{job.device.id}: image {name!r} cannot be copied: "
                                     f"{exc.strerror}", touched=False) from None
    if done != size:
        raise LoadFailed(CHECK_STEP, f"{job.device.id}: image {name!r} changed size while "
                                     f"being read ({done} bytes, {size} when opened)",
                         touched=False)
    return done, hasher.hexdigest()
