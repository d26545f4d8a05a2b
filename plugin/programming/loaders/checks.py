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

from plugin.model.devices import Device
from plugin.programming.gbs import GbsImage, parse_gbs
from plugin.programming.ids import dashed, same_id, sysfs_id
from plugin.programming.library import ImageLibrary
from plugin.programming.loaders.base import LoadFailed, LoadJob
from plugin.programming.xclbin import XclbinImage

CHECK_STEP = "check image"


def image_source(job: LoadJob) -> tuple[ImageLibrary, str]:
    """The job's library and image name; refused when the job names none."""
    if job.library is None or not job.image:
        raise LoadFailed(CHECK_STEP, f"{job.device.id}: no image named to load "
                                     f"{job.function_id}", touched=False)
    return job.library, job.image


def check_gbs(job: LoadJob, gbs: GbsImage) -> None:
    """Refuse a GBS not built for the device's interface or not holding the job's AFU ID."""
    device = job.device
    try:
        gbs.check_interface(device.attrs.get("interface_id"))
    except ValueError as exc:
        raise LoadFailed(CHECK_STEP, f"{device.id}: image {job.image!r}: {exc}",
                         touched=False) from None
    wanted = sysfs_id(job.function_id)
    if wanted is None or not same_id(gbs.afu_id, wanted):
        raise LoadFailed(CHECK_STEP, f"{device.id}: image {job.image!r} holds AFU "
                                     f"{dashed(gbs.afu_id)}, not the requested "
                                     f"{job.function_id}", touched=False)


def gbs_from_bytes(job: LoadJob, data: bytes | bytearray) -> GbsImage:
    """Parse and check the GBS whose bytes are ``data`` (the very bytes to be loaded)."""
    try:
        gbs = parse_gbs(bytes(data[:_header_bound(data)]))
    except ValueError as exc:
        raise LoadFailed(CHECK_STEP, f"{job.device.id}: image {job.image!r}: {exc}",
                         touched=False) from None
    # The header parse saw only the prefix; the bitstream runs to the end of ``data``.
    gbs = _with_length(gbs, len(data) - gbs.bitstream_offset)
    check_gbs(job, gbs)
    if gbs.bitstream_length <= 0:
        raise LoadFailed(CHECK_STEP, f"{job.device.id}: image {job.image!r} has no bitstream "
                                     f"after its metadata", touched=False)
    return gbs


def read_checked_gbs(job: LoadJob) -> GbsImage:
    """The job's GBS header read from the library, checked as :func:`check_gbs` does."""
    library, name = image_source(job)
    try:
        gbs = library.read_gbs(name)
    except ValueError as exc:
        raise LoadFailed(CHECK_STEP, f"{job.device.id}: {exc}", touched=False) from None
    check_gbs(job, gbs)
    if gbs.bitstream_length <= 0:
        raise LoadFailed(CHECK_STEP, f"{job.device.id}: image {name!r} has no bitstream "
                                     f"after its metadata", touched=False)
    return gbs


def read_checked_xclbin(job: LoadJob) -> XclbinImage:
    """The job's xclbin, refused unless its UUID is the job's and, when it names an
    interface, the device's shell offers that interface."""
    library, name = image_source(job)
    device = job.device
    try:
        xclbin = library.read_xclbin(name)
    except ValueError as exc:
        raise LoadFailed(CHECK_STEP, f"{device.id}: {exc}", touched=False) from None
    if not xclbin.holds(job.function_id):
        raise LoadFailed(CHECK_STEP, f"{device.id}: image {name!r} is xclbin "
                                     f"{dashed(xclbin.uuid)}, not the requested "
                                     f"{job.function_id}", touched=False)
    interface = device.attrs.get("interface_uuid")
    if not xclbin.fits_interface(interface):
        raise LoadFailed(CHECK_STEP, f"{device.id}: image {name!r} was built for interface "
                                     f"{dashed(xclbin.interface_uuid or '')}; the shell's is "
                                     f"{interface or 'unknown'}", touched=False)
    return xclbin


def _header_bound(data: bytes | bytearray) -> int:
    """How much of ``data`` the header parse needs: prefix plus the metadata it declares."""
    if len(data) < 20:
        return len(data)
    declared = int.from_bytes(data[16:20], "little")
    return min(len(data), 20 + declared)


def _with_length(gbs: GbsImage, length: int) -> GbsImage:
    return replace(gbs, bitstream_length=length)


def device_attr(device: Device, name: str, step: str) -> str:
    """A discovery fact the load needs; refused (untouched) when discovery did not record it."""
    value = device.attrs.get(name)
    if not value:
        raise LoadFailed(step, f"{device.id}: discovery recorded no {name}", touched=False)
    return value
