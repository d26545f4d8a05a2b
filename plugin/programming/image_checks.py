"""Whether a library image holds the function a configuration names and fits the device.

Checked for every claim that names a function, on the fast path too (the device already
holds it): a configuration whose image is wrong is wrong on every node, and a claim must not
succeed here only to fail on the next node that has to load it. So the header is parsed
once per file version and remembered by the file's identity (device, inode, size, mtime, ctime):
the check on a claim is then a ``stat``, not a parse, and an image replaced in the library
(a new inode, or new contents) is read again.

A configuration's ``sha256`` is checked the same way: the file is hashed once per version
(on a worker thread: a 400 MiB image takes a second or two) and the digest remembered beside
the header, so the fast path stays one ``stat``. The digest is taken through the library's
own open, and the version it is remembered under is the opened file's, so a file swapped
while it was being hashed is never remembered under the new version's name. This is the
driver's early answer; what reaches the card is hashed again, byte for byte, by the loader.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TypeVar

from plugin.programming.digest import mismatch, sha256_of_fd
from plugin.programming.function_config import FunctionSpec
from plugin.programming.gbs import GbsImage
from plugin.programming.ids import dashed, sysfs_id
from plugin.programming.library import ImageLibrary
from plugin.programming.xclbin import XclbinImage
from value_types.devices import Device

MAX_REMEMBERED = 256
Header = GbsImage | XclbinImage
_K = TypeVar("_K")
_V = TypeVar("_V")


@dataclass(frozen=True)
class _Identity:
    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int
    """Changed by any write, even one that puts the old modification time back."""


class DigestMismatch(ValueError):
    """An image's bytes are not the ones its configuration pins."""

    def __init__(self, image: str, expected: str, actual: str) -> None:
        super().__init__(mismatch(image, expected, actual))
        self.image = image
        self.expected = expected
        self.actual = actual


class ImageChecks:
    """Image headers and digests of one library, read once per file version."""

    def __init__(self, library: ImageLibrary) -> None:
        self.library = library
        self._headers: dict[tuple[str, str], tuple[_Identity, Header]] = {}
        self._digests: dict[str, tuple[_Identity, str]] = {}
        self.hashed = 0
        """Files hashed so far (the cache's misses), for tests and the bench."""

    async def digest(self, name: str) -> str:
        """The sha256 of image ``name`` as the library holds it now: one ``stat`` when the
        file has not changed since it was last hashed."""
        known = self._remembered(self._digests, name, name)
        if known is not None:
            return known
        import asyncio  # here: the loader process imports this module's checks, not asyncio

        identity, digest = await asyncio.to_thread(self._hash, name)
        _remember(self._digests, name, identity, digest)
        return digest

    def _hash(self, name: str) -> tuple[_Identity, str]:
        with self.library.open(name) as (stream, _size):
            fd = stream.fileno()
            before = os.fstat(fd)
            digest = sha256_of_fd(fd)
            after = os.fstat(fd)
        self.hashed += 1
        if _identity(before) != _identity(after):
            raise ValueError(f"image {name!r} changed while it was being hashed")
        return _identity(after), digest

    async def check_digest(self, spec: FunctionSpec) -> str | None:
        """The image's digest (None for a function with no image), DigestMismatch when the
        configuration pins another one."""
        if spec.image is None:
            return None
        actual = await self.digest(spec.image)
        if spec.sha256 is not None and actual != spec.sha256:
            raise DigestMismatch(spec.image, spec.sha256, actual)
        return actual

    def check(self, spec: FunctionSpec, device: Device) -> None:
        """ValueError naming the image and the problem unless ``spec``'s image holds its
        function and was built for ``device``'s interface (AWS functions have no image)."""
        if spec.image is None:
            return
        if device.backend == "intel":
            gbs = self._header(spec.image, "gbs")
            assert isinstance(gbs, GbsImage)
            check_gbs_fits(spec.image, gbs, spec.function_id, device)
        elif device.backend == "alveo":
            xclbin = self._header(spec.image, "xclbin")
            assert isinstance(xclbin, XclbinImage)
            check_xclbin_fits(spec.image, xclbin, spec.function_id, device)
        else:
            raise ValueError(f"device {device.id} ({device.backend}) is not loaded from "
                             "image files")

    def served(self, name: str, family: str) -> tuple[str, int | None]:
        """The function image ``name`` gives a device of ``family`` (a GBS's first cluster's
        AFU ID, an xclbin's UUID) and how many users the image says it serves (the cluster's
        ``total-contexts``, the xclbin's compute units; None: it does not say). Read through
        the same per-file-version memory as :meth:`check`; ValueError when it cannot be."""
        if family == "intel":
            gbs = self._header(name, "gbs")
            assert isinstance(gbs, GbsImage)
            return gbs.afu_id, gbs.total_contexts
        if family == "alveo":
            xclbin = self._header(name, "xclbin")
            assert isinstance(xclbin, XclbinImage)
            return xclbin.uuid, xclbin.compute_units
        raise ValueError(f"{family} devices are not loaded from image files")

    def _header(self, name: str, kind: str) -> Header:
        """The header of ``name``, parsed once per file version.

        A hit costs one ``stat`` of the name as given: the full containment check (the
        resolved path inside the library) runs when the file is first read or has changed,
        and again whenever a loader opens it, so what is read is always inside."""
        known = self._remembered(self._headers, (name, kind), name)
        if known is not None:
            return known
        real = self.library.resolve(name)
        try:
            info = os.stat(real)
        except OSError as exc:
            raise ValueError(f"image {name!r} cannot be read: {exc.strerror}") from None
        header: Header = (self.library.read_gbs(name) if kind == "gbs"
                          else self.library.read_xclbin(name))
        _remember(self._headers, (name, kind), _identity(info), header)
        return header

    def _remembered(self, cache: dict[_K, tuple[_Identity, _V]], key: _K, name: str
                    ) -> _V | None:
        """What ``cache`` holds for ``key`` while image ``name`` is the version it was
        taken from (one ``stat``); None when it is not, or cannot be told."""
        known = cache.get(key)
        if known is None:
            return None
        try:
            info = os.stat(self.library.root / name)
        except OSError:
            return None
        return known[1] if known[0] == _identity(info) else None


def _remember(cache: dict[_K, tuple[_Identity, _V]], key: _K, identity: _Identity,
              value: _V) -> None:
    """Keep ``value`` for ``key``, the oldest entry dropped past :data:`MAX_REMEMBERED`."""
    cache.pop(key, None)
    if len(cache) >= MAX_REMEMBERED:
        cache.pop(next(iter(cache)))
    cache[key] = (identity, value)


def _identity(info: os.stat_result) -> _Identity:
    return _Identity(info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns,
                     info.st_ctime_ns)


def check_gbs_fits(name: str, gbs: GbsImage, function_id: str, device: Device) -> None:
    """ValueError unless GBS ``name`` holds ``function_id`` as the AFU its port would report
    (the first accelerator cluster's) and was built for ``device``'s PR interface: the one
    rule for a claim's configuration and for a loader's last look before the card."""
    wanted = sysfs_id(function_id) or function_id
    if not gbs.holds(wanted):
        raise ValueError(f"image {name} holds AFU ID "
                         f"{', '.join(dashed(a) for a in gbs.afu_ids)}, not the requested "
                         f"{dashed(wanted)}")
    if gbs.afu_id != wanted:
        raise ValueError(f"image {name}: AFU ID {dashed(wanted)} is not its first "
                         "accelerator cluster's, which is what the port would report "
                         f"({dashed(gbs.afu_id)})")
    try:
        gbs.check_interface(device.attribute("interface_id") or None)
    except ValueError as exc:
        raise ValueError(f"image {name} does not fit device {device.id}: {exc}") from None


def check_xclbin_fits(name: str, xclbin: XclbinImage, function_id: str,
                      device: Device) -> None:
    """ValueError unless xclbin ``name`` is ``function_id``, has a bitstream, and targets
    ``device``'s shell (VBNV and interface UUID)."""
    if not xclbin.holds(function_id):
        raise ValueError(f"image {name} is xclbin {dashed(xclbin.uuid)}, not the requested "
                         f"{dashed(sysfs_id(function_id) or function_id)}")
    if not xclbin.has_bitstream():
        raise ValueError(f"image {name} (xclbin {dashed(xclbin.uuid)}) has no bitstream "
                         "section to load")
    try:
        xclbin.check_target(device.attribute("shell") or None,
                            device.attribute("interface_uuid") or None)
    except ValueError as exc:
        raise ValueError(f"image {name} does not fit device {device.id}: {exc}") from None


DESCRIBED_ONLY = frozenset({"aws"})
"""Families whose loaded function discovery cannot read: only the vendor SDK's describe
tells it (an AWS slot's AGFI)."""


def held_function(device: Device) -> str | None:
    """The function ``device`` reports holding, as discovery read it (normalised), or None
    where discovery cannot tell (AWS: only the SDK's describe can)."""
    if device.backend == "intel":
        return sysfs_id(device.attribute("afu_id") or None)
    if device.backend == "alveo":
        return sysfs_id(device.attribute("xclbin_uuid") or None)
    return None
