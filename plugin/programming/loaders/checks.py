"""The checks every loader makes on the image just before the card is touched.

The caller chose the image for the function a claim asked for, but the file may have been
replaced since, and a vendor tool or the kernel checks less than this driver promises: the
kernel's port-PR ioctl checks nothing about the bitstream (a wrong interface shows as a
hardware PR error, after the region was already disabled), and ``fpgaconf`` only matches
the interface. So right before loading, the image is read again and must (1) be built for
the interface the device reports and (2) hold the function the job says it does; otherwise
the load is refused with ``touched=False``: the card still holds what it held.
"""

from __future__ import annotations

from dataclasses import replace
from typing import BinaryIO

from plugin.programming.gbs import GbsImage, parse_gbs, read_gbs
from plugin.programming.image_checks import check_gbs_fits, check_xclbin_fits
from plugin.programming.library import ImageLibrary
from plugin.programming.loaders.base import LoadFailed, LoadJob
from plugin.programming.xclbin import XclbinImage, read_xclbin
from value_types.devices import Device

CHECK_STEP = "check image"


def image_source(job: LoadJob) -> tuple[ImageLibrary, str]:
    """The job's library and image name; refused when the job names none."""
    if job.library is None or not job.image:
        raise LoadFailed(CHECK_STEP, f"{job.device.id}: no image named to load "
                                     f"{job.function_id}", touched=False)
    return job.library, job.image


def gbs_from_bytes(job: LoadJob, data: bytes | bytearray) -> GbsImage:
    """Parse and check the GBS whose bytes are ``data`` (the very bytes to be loaded)."""
    try:
        gbs = parse_gbs(bytes(data[:_header_bound(data)]))
    except ValueError as exc:
        raise LoadFailed(CHECK_STEP, f"{job.device.id}: image {job.image!r}: {exc}",
                         touched=False) from None
    # The header parse saw only the prefix; the bitstream runs to the end of ``data``.
    return _checked_gbs(job, replace(gbs, bitstream_length=len(data) - gbs.bitstream_offset))


def checked_gbs_in(job: LoadJob, stream: BinaryIO, size: int) -> GbsImage:
    """The GBS header of the ``size``-byte copy open in ``stream`` (the bytes a tool will
    load), checked as :func:`gbs_from_bytes` does."""
    try:
        gbs = read_gbs(stream, size)
    except (ValueError, OSError) as exc:
        raise LoadFailed(CHECK_STEP, f"{job.device.id}: image {job.image!r}: {exc}",
                         touched=False) from None
    return _checked_gbs(job, gbs)


def checked_xclbin_in(job: LoadJob, stream: BinaryIO, size: int) -> XclbinImage:
    """The xclbin of the ``size``-byte copy open in ``stream``, refused unless it is the
    job's function and fits the device's shell
    (:func:`~plugin.programming.image_checks.check_xclbin_fits`)."""
    name = job.image or ""
    try:
        xclbin = read_xclbin(stream, size)
    except (ValueError, OSError) as exc:
        raise LoadFailed(CHECK_STEP, f"{job.device.id}: image {name!r}: {exc}",
                         touched=False) from None
    try:
        check_xclbin_fits(name, xclbin, job.function_id, job.device)
    except ValueError as exc:
        raise LoadFailed(CHECK_STEP, f"{job.device.id}: {exc}", touched=False) from None
    return xclbin


def _checked_gbs(job: LoadJob, gbs: GbsImage) -> GbsImage:
    """``gbs`` refused (untouched) unless it fits the job's device and function
    (:func:`~plugin.programming.image_checks.check_gbs_fits`) and has a bitstream."""
    try:
        check_gbs_fits(job.image or "", gbs, job.function_id, job.device)
    except ValueError as exc:
        raise LoadFailed(CHECK_STEP, f"{job.device.id}: {exc}", touched=False) from None
    if gbs.bitstream_length <= 0:
        raise LoadFailed(CHECK_STEP, f"{job.device.id}: image {job.image!r} has no bitstream "
                                     f"after its metadata", touched=False)
    return gbs


def _header_bound(data: bytes | bytearray) -> int:
    """How much of ``data`` the header parse needs: prefix plus the metadata it declares."""
    if len(data) < 20:
        return len(data)
    declared = int.from_bytes(data[16:20], "little")
    return min(len(data), 20 + declared)


def device_attr(device: Device, name: str, step: str) -> str:
    """A discovery fact the load needs; refused (untouched) when discovery did not record it."""
    value = device.attrs.get(name)
    if not value:
        raise LoadFailed(step, f"{device.id}: discovery recorded no {name}", touched=False)
    return value
