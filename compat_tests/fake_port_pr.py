"""A stand-in for the kernel's FME port-PR ioctl, for the :data:`IoctlCall` seam.

It does what the drivers do with the request, on a :class:`FakeNode`, and records it:

* the request number must be the one the UAPI header's macros give for the driver whose
  FME node the descriptor is open on (``readlink /proc/self/fd/<fd>``): DFL's
  ``_IO(DFL_FPGA_MAGIC 0xB6, DFL_FME_BASE 0x80 + 0)`` for ``dfl-fme.N``, OPAE's
  ``_IO(FPGA_MAGIC 0xB5, FME_BASE 0x80 + 0)`` for ``intel-fpga-fme.N``. The numbers are
  computed here from ``_IOC`` as ``include/uapi/asm-generic/ioctl.h`` defines it, not taken
  from the code under test; anything else fails with ENOTTY;
* the argument is unpacked field by field as the header lays it out; a buffer shorter than
  the struct is EFAULT (``copy_from_user``), ``argsz`` short of the struct or non-zero
  ``flags`` EINVAL, a ``port_id`` that is not one of that FME's ports EINVAL
  (``dfl-fme-pr.c`` ``fme_pr()``);
* ``buffer_size`` bytes are read at ``buffer_address`` (``ctypes.string_at``, as
  ``copy_from_user`` reads the caller's memory) and must be the raw bitstream of one of the
  GBS images the stand-in was given, built for the card's interface; otherwise the "hardware"
  fails the PR: EIO, with the OPAE driver's ``status`` bit for an incompatible bitstream;
* on success the port's ``afu_id`` becomes the image's AFU ID, as the port reports once the
  region holds the new function.

Options make it slow (``delay``), fail after the checks with an errno (``fail_errno``:
EINVAL, EIO, EBUSY...; EIO sets OPAE's ``status`` to ``opae_status``) or leave the port's
``afu_id`` garbled. Every call is recorded in :attr:`FakePortPr.calls`.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from compat_tests.fake_fpga_tools import GbsParts, gbs_parts, interface_of
from compat_tests.fake_sysfs import FakeCard, FakeNode

# include/uapi/asm-generic/ioctl.h
_IOC_NRSHIFT = 0
_IOC_TYPESHIFT = 8
_IOC_SIZESHIFT = 16
_IOC_DIRSHIFT = 30
_IOC_NONE = 0


def _IOC(direction: int, kind: int, number: int, size: int) -> int:
    return ((direction << _IOC_DIRSHIFT) | (kind << _IOC_TYPESHIFT)
            | (number << _IOC_NRSHIFT) | (size << _IOC_SIZESHIFT))


def _IO(kind: int, number: int) -> int:
    return _IOC(_IOC_NONE, kind, number, 0)


# include/uapi/linux/fpga-dfl.h
DFL_FPGA_MAGIC = 0xB6
DFL_FME_BASE = 0x80
DFL_FPGA_FME_PORT_PR = _IO(DFL_FPGA_MAGIC, DFL_FME_BASE + 0)
DFL_FIELDS = (("argsz", "I"), ("flags", "I"), ("port_id", "I"), ("buffer_size", "I"),
              ("buffer_address", "Q"))
# OPAE intel-fpga driver, include/uapi/linux/intel-fpga.h
FPGA_MAGIC = 0xB5
FME_BASE = 0x80
FPGA_FME_PORT_PR = _IO(FPGA_MAGIC, FME_BASE + 0)
OPAE_FIELDS = (*DFL_FIELDS, ("status", "Q"))
PR_INCOMPATIBLE_BITSTREAM = 1 << 2
"""Bit 2 of the OPAE driver's ``status``: "PR incompatible bitstream error detected"."""

GARBLED = "not-an-afu-id"


@dataclass
class PrCall:
    """One call as the stand-in saw it."""

    node: str
    request: int
    fields: dict[str, int] = field(default_factory=dict)
    payload_matched: bool = False
    outcome: str = "ok"
    """``ok`` or the errno's name."""


class FakePortPr:
    """A callable ``(fd, request, arg) -> int`` behaving as the FME's port-PR ioctl."""

    def __init__(self, node: FakeNode, images: Sequence[bytes] = (), *,
                 delay: float = 0.0, fail_errno: int | None = None, garble: bool = False,
                 opae_status: int = 1) -> None:
        self.node = node
        self.images: list[GbsParts] = [gbs_parts(data) for data in images]
        self.delay = delay
        self.fail_errno = fail_errno
        self.garble = garble
        self.opae_status = opae_status
        self.calls: list[PrCall] = []

    def add_image(self, data: bytes) -> None:
        self.images.append(gbs_parts(data))

    def __call__(self, fd: int, request: int, arg: bytearray) -> int:
        name = Path(os.readlink(f"/proc/self/fd/{fd}")).name
        call = PrCall(name, request)
        self.calls.append(call)
        try:
            self._pr(fd, name, request, arg, call)
        except OSError as exc:
            call.outcome = errno.errorcode.get(exc.errno or 0, str(exc.errno))
            raise
        return 0

    def _pr(self, fd: int, name: str, request: int, arg: bytearray, call: PrCall) -> None:
        card = self._card(fd, name)
        opae = card.driver == "intel-fpga"
        expected = FPGA_FME_PORT_PR if opae else DFL_FPGA_FME_PORT_PR
        if request != expected:
            _fail(errno.ENOTTY)
        fields = OPAE_FIELDS if opae else DFL_FIELDS
        layout = struct.Struct("<" + "".join(kind for _, kind in fields))
        if len(arg) < layout.size:
            _fail(errno.EFAULT)
        call.fields = dict(zip((n for n, _ in fields), layout.unpack_from(arg), strict=True))
        if call.fields["argsz"] < layout.size or call.fields["flags"] != 0:
            _fail(errno.EINVAL)
        ports = self._ports(card)
        port = ports.get(call.fields["port_id"])
        if port is None:
            _fail(errno.EINVAL)
        size, address = call.fields["buffer_size"], call.fields["buffer_address"]
        if address == 0 and size:
            _fail(errno.EFAULT)
        payload = ctypes.string_at(address, size)
        image = next((i for i in self.images if i.bitstream == payload), None)
        call.payload_matched = image is not None
        if self.delay:
            time.sleep(self.delay)
        interface = interface_of(card.path, card.fme)
        if image is None or image.interface_id != interface:
            self._status(arg, layout, opae, PR_INCOMPATIBLE_BITSTREAM)
            _fail(errno.EIO)
        if self.fail_errno is not None:
            if self.fail_errno == errno.EIO:
                self._status(arg, layout, opae, self.opae_status)
            _fail(self.fail_errno)
        (port / "afu_id").write_text((GARBLED if self.garble else image.afu_id) + "\n")

    def _card(self, fd: int, name: str) -> FakeCard:
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        if path.parent != self.node.dev_root.resolve() and path.parent != self.node.dev_root:
            _fail(errno.ENOTTY)
        for card in self.node.cards.values():
            if card.fme is not None and card.fme.name == name:
                return card
        _fail(errno.ENOTTY)
        raise AssertionError  # unreachable

    def _ports(self, card: FakeCard) -> dict[int, Path]:
        ports = {}
        for port_name in card.ports:
            path = self.node.ports[port_name].path
            ports[int((path / "id").read_text())] = path
        return ports

    @staticmethod
    def _status(arg: bytearray, layout: struct.Struct, opae: bool, status: int) -> None:
        if opae:  # the OPAE driver copies the struct back with the PR error bits
            struct.pack_into("<Q", arg, layout.size - 8, status)


def _fail(code: int) -> None:
    raise OSError(code, os.strerror(code))
