"""Partial reconfiguration of one Intel FPGA port through its FME's port-PR ioctl, natively.

This is what OPAE's ``fpgaReconfigureSlot`` does underneath ``fpgaconf``, without OPAE: open
the card's FPGA Management Engine node and hand the kernel the raw bitstream and the port
number. Two drivers, two ABIs, told apart by the node's name:

* upstream DFL, ``/dev/dfl-fme.N`` (torvalds/linux ``include/uapi/linux/fpga-dfl.h`` at
  2863b00941bc3062ea3299ed4057acfd9e52c335)::

      #define DFL_FPGA_MAGIC 0xB6
      #define DFL_FME_BASE 0x80
      #define DFL_FPGA_FME_PORT_PR _IO(DFL_FPGA_MAGIC, DFL_FME_BASE + 0)      = 0xb680
      struct dfl_fpga_fme_port_pr {          24 bytes, no padding
          __u32 argsz; __u32 flags; __u32 port_id; __u32 buffer_size;
          __u64 buffer_address; };

* OPAE's out-of-tree ``intel-fpga`` driver, ``/dev/intel-fpga-fme.N`` (its
  ``include/uapi/linux/intel-fpga.h``, as mirrored in jiazhang0/opae-intel-fpga-driver at
  6018fa57ba305cbe7694eb4a694524027028fff7, and the copy OPAE builds against,
  OFS/opae-sdk ``libraries/plugins/xfpga/intel-fpga.h`` at
  c52aef5aefdacdcc238097e6b8f260f7924f9f04). Its magic is 0xB5, not DFL's 0xB6, and the
  struct has one more field, written back by the driver::

      #define FPGA_MAGIC 0xB5
      #define FME_BASE 0x80
      #define FPGA_FME_PORT_PR _IO(FPGA_MAGIC, FME_BASE + 0)                  = 0xb580
      struct fpga_fme_port_pr {              32 bytes, no padding
          __u32 argsz; __u32 flags; __u32 port_id; __u32 buffer_size;
          __u64 buffer_address; __u64 status; /* out: PR error bits on -EIO */ };

(``_IO`` encodes no direction and no size, so the number is ``magic << 8 | nr``; the
kernel copies the struct itself, ``argsz`` bytes.)

What the kernel checks (``drivers/fpga/dfl-fme-pr.c`` ``fme_pr()`` at
0470fb7f23c39a7ee75aeae7fdd03f1cb2e2c064; the OPAE driver's ``drivers/fpga/intel/fme-pr.c``
at the commit above does the same): ``argsz`` at least the struct up to its last field
(``offsetofend``) else EINVAL, ``flags`` zero else EINVAL, ``port_id`` below the FME's port
count else EINVAL, the buffer readable else EFAULT. It copies ``buffer_size`` bytes and pads
them itself to the PR width (``ALIGN(buffer_size, 4)``; OPAE's ``ALIGN(.., pr_bandwidth)``
with zeros), so no alignment is asked of the caller. A hardware PR error is EIO (OPAE's
driver also reports which, in ``status``); a port with no region is EINVAL.

Which bytes: OPAE passes the raw bitstream that follows the GBS header and metadata
(``libraries/plugins/xfpga/reconf.c`` ``xfpga_fpgaReconfigureSlot``:
``bitstream_len - bitstream_header_len`` bytes at ``bitstream + bitstream_header_len``, with
``argsz = sizeof(port_pr)`` and ``flags = 0`` in ``opae_drv.c``; same commit as above), which
is :attr:`GbsImage.bitstream_offset` / ``bitstream_length``.

Unlike ``fpgaconf`` this loader does not program the AFU's user clocks from the GBS's
``clock-frequency-*`` (OPAE's ``set_afu_userclock``; ``fpgaconf --skip-usrclk`` leaves
them too), does not clear the port's error register first, and does not open the port
exclusively to see that no process uses it: the caller holds the card for the claim.

The file is read once, through the image library (its containment checks), and the very
bytes read are hashed (against the digest the job pins), checked (interface, AFU ID) and
loaded, so the image cannot change between check and load. The load blocks its thread (the
``loader`` process's connection thread, or a worker thread for ``serve``'s async path), which
owns the descriptor and the buffer until the kernel returns; a cancelled ``serve`` load
waits for the ioctl under way to return before it ends.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from plugin.model.sha256 import sha256_hex
from plugin.programming.digest import DIGEST_STEP, mismatch
from plugin.programming.loaders.base import LoadFailed, LoadJob
from plugin.programming.loaders.checks import (
    CHECK_STEP,
    device_attr,
    gbs_from_bytes,
    image_source,
)
from plugin.programming.loaders.tools import in_thread
from value_types.devices import Device

IoctlCall = Callable[[int, int, bytearray], int]
"""``ioctl(fd, request, arg)`` with a mutable argument buffer; raises OSError like
:func:`fcntl.ioctl`. The seam a stand-in replaces to check the exact bytes."""

OPEN_STEP = "open FME node"
IOCTL_STEP = "port-PR ioctl"
MAX_BUFFER = 0xFFFFFFFF
"""``buffer_size`` is a ``__u32``."""
OPAE_PR_ERRORS = (
    "PR operation error detected",
    "PR CRC error detected",
    "PR incompatible bitstream error detected",
    "PR IP protocol error detected",
    "PR FIFO overflow error detected",
    "PR timeout error detected",
    "PR secure load error detected",
)
"""Bit i of the OPAE driver's ``status``: ``DEFINE_FPGA_PR_ERR_MSG`` in its
``intel-fpga.h`` (commit above), spelling fixed."""


def _io(magic: int, number: int) -> int:
    """``_IO(magic, number)``: direction 0 and size 0, so only type and number bits."""
    return (magic << 8) | number


@dataclass(frozen=True)
class PortPrAbi:
    """One driver's port-PR ioctl: node name prefix, request number, argument layout."""

    driver: str
    node_prefix: str
    request: int
    layout: struct.Struct

    def pack(self, port_id: int, size: int, address: int) -> bytearray:
        arg = bytearray(self.layout.size)
        fields = [self.layout.size, 0, port_id, size, address]  # argsz, flags, ...
        fields += [0] * (len(self.layout.format.lstrip("<")) - len(fields))  # OPAE's status
        self.layout.pack_into(arg, 0, *fields)
        return arg


DFL = PortPrAbi("dfl", "dfl-fme.", _io(0xB6, 0x80), struct.Struct("<IIIIQ"))
OPAE = PortPrAbi("intel-fpga", "intel-fpga-fme.", _io(0xB5, 0x80), struct.Struct("<IIIIQQ"))
ABIS = (DFL, OPAE)


def real_ioctl(fd: int, request: int, arg: bytearray) -> int:
    """The kernel's ioctl; the driver may write back into ``arg`` (OPAE's ``status``)."""
    return fcntl.ioctl(fd, request, arg, True)


def abi_for(node_name: str) -> PortPrAbi | None:
    """The ABI of the FME node called ``node_name`` (``dfl-fme.0``), None if neither."""
    for abi in ABIS:
        rest = node_name.removeprefix(abi.node_prefix)
        if rest != node_name and rest.isdigit():
            return abi
    return None


class PortPrIoctl:
    """Intel port loader through ``DFL_FPGA_FME_PORT_PR`` / ``FPGA_FME_PORT_PR``."""

    name = "ioctl"
    family = "intel"

    def __init__(self, dev_root: Path, ioctl: IoctlCall = real_ioctl) -> None:
        self.dev_root = Path(dev_root)
        self._ioctl = ioctl

    def unavailable(self, device: Device) -> str | None:
        if device.backend != self.family:
            return f"{device.id}: a {device.backend} device, not an Intel FPGA port"
        node = device.attrs.get("fme_node")
        if not node:
            return (f"{device.id}: no FPGA Management Engine device node (a virtual "
                    f"function's port has none; or /dev has no dfl-fme.N/intel-fpga-fme.N)")
        name = Path(node).name
        if abi_for(name) is None:
            return f"{device.id}: FME node {node} is neither dfl-fme.N nor intel-fpga-fme.N"
        if not device.attrs.get("port_number", "").isdigit():
            return f"{device.id}: discovery recorded no port number"
        path = self.dev_root / name
        if not path.exists():
            return f"{device.id}: FME node {path} does not exist"
        return None

    async def loaded(self, device: Device) -> str | None:
        return self.loaded_blocking(device)

    def loaded_blocking(self, device: Device) -> str | None:
        return None  # the port's afu_id, which discovery reads, tells

    async def load(self, job: LoadJob) -> None:
        await in_thread(lambda: self.load_blocking(job))

    def load_blocking(self, job: LoadJob) -> None:
        """Read, hash, check, program: all in the calling thread, which owns the
        descriptor and the buffer until the kernel returns."""
        device = job.device
        problem = self.unavailable(device)
        if problem is not None:
            raise LoadFailed(OPEN_STEP, problem, touched=False)
        name = Path(device_attr(device, "fme_node", OPEN_STEP)).name
        abi = abi_for(name)
        assert abi is not None  # unavailable() said so
        port = int(device.attrs["port_number"])
        data = _read_image(job)
        if job.sha256 is not None:
            digest = sha256_hex(data)
            if digest != job.sha256:
                raise LoadFailed(DIGEST_STEP, mismatch(job.image or "", job.sha256, digest),
                                 touched=False)
        gbs = gbs_from_bytes(job, data)
        if gbs.bitstream_length > MAX_BUFFER:
            raise LoadFailed(CHECK_STEP, f"{device.id}: image {job.image!r} has a "
                                         f"{gbs.bitstream_length}-byte bitstream, more than "
                                         f"the ioctl's 32-bit buffer_size", touched=False)
        self._program(self.dev_root / name, abi, port, data, gbs.bitstream_offset,
                      gbs.bitstream_length)

    def _program(self, path: Path, abi: PortPrAbi, port: int, data: bytearray,
                 offset: int, length: int) -> None:
        """Open the node, run the ioctl, close, keeping ``data`` (the buffer the kernel
        reads) alive until the kernel is done with it."""
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as exc:
            raise LoadFailed(OPEN_STEP, f"{path}: {exc.strerror} (errno {exc.errno})",
                             touched=False) from None
        payload = (ctypes.c_char * length).from_buffer(data, offset)
        try:
            arg = abi.pack(port, length, ctypes.addressof(payload))
            try:
                self._ioctl(fd, abi.request, arg)
            except OSError as exc:
                raise LoadFailed(IOCTL_STEP, _ioctl_detail(exc, path, port, abi, arg)) from None
        finally:
            os.close(fd)
            del payload


def _read_image(job: LoadJob) -> bytearray:
    """The whole image file, read through the library (its containment and size checks)."""
    library, name = image_source(job)
    try:
        with library.open(name) as (stream, size):
            data = bytearray(size)
            view = memoryview(data)
            done = 0
            while done < size:
                count = stream.readinto(view[done:])
                if not count:
                    break
                done += count
            view.release()
    except ValueError as exc:
        raise LoadFailed(CHECK_STEP, f"{job.device.id}: {exc}", touched=False) from None
    except OSError as exc:
        raise LoadFailed(CHECK_STEP, f"{job.device.id}: image {name!r} cannot be read: "
                                     f"{exc.strerror}", touched=False) from None
    if done != size:
        raise LoadFailed(CHECK_STEP, f"{job.device.id}: image {name!r} shrank while being "
                                     f"read ({done} of {size} bytes)", touched=False)
    return data


def _ioctl_detail(exc: OSError, path: Path, port: int, abi: PortPrAbi,
                  arg: bytearray) -> str:
    code = exc.errno or 0
    text = f"{os.strerror(code)} (errno {code}) from {path}, port {port}"
    if code == errno.EIO:
        errors = []
        if abi is OPAE:
            status = abi.layout.unpack_from(arg)[5]
            errors = [msg for bit, msg in enumerate(OPAE_PR_ERRORS) if status >> bit & 1]
        text += ": the FPGA reported a partial-reconfiguration error" + (
            f" ({'; '.join(errors)})" if errors else "")
    elif code == errno.EINVAL:
        text += ": the driver refused the request (no such port region, or argument)"
    elif code == errno.EBUSY:
        text += ": the port or its FME is busy"
    return text
