"""Xilinx XRT xclbin files: the ``axlf`` header and section table, checked before a card is touched.

Layout from XRT's ``src/runtime_src/core/include/xclbin.h`` (Xilinx/XRT at commit
0302efcc7308092472f53896132b1dda78e0ee08), every integer little-endian, C alignment::

    struct axlf                                   offset
        char     m_magic[8]          "xclbin2\\0"     0
        int32_t  m_signature_length  -1: unsigned     8
        uchar    reserved[28]                        12
        uchar    m_keyBlock[256]                     40
        uint64_t m_uniqueId                         296
        struct axlf_header m_header (152 bytes)     304
            uint64_t m_length                 whole file      304
            uint64_t m_timeStamp                              312
            uint64_t m_featureRomTimeStamp                    320
            uint16_t m_versionPatch; uint8_t Major, Minor     328
            uint16_t m_mode (XCLBIN_MODE)                     332
            uint16_t m_actionMask                             334
            uchar    m_interface_uuid[16]                     336
            uchar    m_platformVBNV[64]      NUL-terminated   352
            union { m_next_axlf[16]; xuid_t uuid }  (xclbin)  416
            char     m_debug_bin[16]                          432
            uint32_t m_numSections    (+4 bytes padding)      448
        struct axlf_section_header m_sections[]     456, 40 bytes each:
            uint32_t m_sectionKind; char m_sectionName[16]; (4 bytes padding)
            uint64_t m_sectionOffset; uint64_t m_sectionSize

The compute units are counted from the ``IP_LAYOUT`` section (kind 8), the first one as
XRT's ``get_axlf_section`` takes it, read as the same header lays it out::

    struct ip_layout { int32_t m_count; (4 bytes padding) struct ip_data m_ip_data[]; }
    struct ip_data   { uint32_t m_type;  uint32_t properties (a union);
                       uint64_t m_base_address; uint8_t m_name[64]; }   80 bytes

with ``enum IP_TYPE { IP_MB = 0, IP_KERNEL, ... }``: each ``IP_KERNEL`` entry is a kernel
instance, a compute unit a process opens its own context on, so their number is how many
users the xclbin serves at once (``--dra-share alveo=image``). The entries start at offset 8
because ``ip_data`` holds a ``uint64_t``. An image with no ``IP_LAYOUT`` has no count.

(The header asserts the 152- and 40-byte sizes; older headers put a ``rom_uuid``/platform
ID union where ``m_interface_uuid`` is, which is why an all-zero interface UUID means
"none": such an image is matched by its VBNV alone.) The UUIDs are raw bytes in
``uuid_parse`` order, so their hex digits are what XRT's sysfs (``xclbinuuid``,
``interface_uuids``) prints.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from typing import BinaryIO

from plugin.programming.ids import dashed, same_id, sysfs_id
from plugin.programming.reading import read_exact

MAGIC = b"xclbin2\0"
AXLF = struct.Struct("<8si28s256sQ")
HEADER = struct.Struct("<QQQHBBHH16s64s16s16sI4x")
SECTION = struct.Struct("<I16s4xQQ")
SECTIONS_OFFSET = AXLF.size + HEADER.size
MAX_SECTIONS = 0x10000  # XCLBIN_MAX_NUM_SECTION
BITSTREAM = 0
BITSTREAM_PARTIAL_PDI = 19
PDI = 18
IP_LAYOUT = 8
IP_KERNEL = 1
IP_LAYOUT_HEAD = 8
"""``m_count`` and the padding that aligns ``m_ip_data`` to 8 bytes."""
IP_DATA = struct.Struct("<II Q 64s")
MAX_IP_ENTRIES = 0x10000
"""An IP layout lists a card's IPs (tens, at most a few hundred); a count beyond this is a
corrupt section, refused before anything is read for it."""
_IP_CHUNK = 256
_ZERO_UUID = bytes(16)


@dataclass(frozen=True)
class Section:
    """One entry of the section table: what it holds and where, inside the file."""

    kind: int
    name: str
    offset: int
    size: int


@dataclass(frozen=True)
class XclbinImage:
    """What an xclbin's header says; UUIDs as 32 lower-case hex digits."""

    uuid: str
    platform_vbnv: str
    interface_uuid: str | None
    length: int
    timestamp: int
    feature_rom_timestamp: int
    version: tuple[int, int, int]
    mode: int
    signature_length: int
    sections: tuple[Section, ...]
    compute_units: int | None = None
    """``IP_KERNEL`` entries of the ``IP_LAYOUT`` section; None when the image has none."""

    def fits_platform(self, vbnv: str | None) -> bool:
        """True when the shell's VBNV (XRT's ``rom`` ``VBNV``) is the image's target platform."""
        return vbnv is not None and vbnv.strip() == self.platform_vbnv

    def fits_interface(self, sysfs_text: str | None) -> bool:
        """True when one of the shell's ``interface_uuids`` lines is the image's interface.

        An image without an interface UUID (older tools) fits on its VBNV here; XRT then
        also compares ``feature_rom_timestamp`` with the shell ROM's ``timestamp``.
        """
        if self.interface_uuid is None:
            return True
        lines = (sysfs_text or "").split()
        return any(same_id(self.interface_uuid, line) for line in lines)

    def check_target(self, vbnv: str | None, interface_text: str | None) -> None:
        """Raise ValueError naming both sides unless the shell is the one the image targets."""
        if not self.fits_platform(vbnv):
            raise ValueError(f"xclbin {dashed(self.uuid)} targets platform "
                             f"{self.platform_vbnv!r}; the card's shell is {vbnv!r}")
        if not self.fits_interface(interface_text):
            raise ValueError(f"xclbin {dashed(self.uuid)} was built for interface "
                             f"{dashed(self.interface_uuid or '')}; the shell's are "
                             f"{(interface_text or '').split() or 'unknown'}")

    def loaded_on(self, sysfs_xclbinuuid: str | None) -> bool:
        """True when XRT's ``xclbinuuid`` shows this image is already loaded."""
        return same_id(self.uuid, sysfs_xclbinuuid)

    def holds(self, xclbin_uuid: str) -> bool:
        """True when ``xclbin_uuid`` (any spelling) is this image's UUID."""
        return sysfs_id(xclbin_uuid) == self.uuid

    def has_bitstream(self) -> bool:
        """True when a section carries something to program (bitstream or PDI)."""
        return any(s.kind in (BITSTREAM, PDI, BITSTREAM_PARTIAL_PDI) and s.size > 0
                   for s in self.sections)


def read_xclbin(stream: BinaryIO, size: int) -> XclbinImage:
    """Parse the header and section table of the ``size``-byte xclbin open in ``stream``.

    Reads the 456-byte header, 40 bytes per section and the ``IP_LAYOUT`` section's entries,
    never the other sections' data (the bitstream). Raises
    ValueError naming the problem for a file XRT would refuse or this reader cannot vouch for.
    """
    head = _read_exact(stream, SECTIONS_OFFSET, size, "the 456-byte header")
    magic, signature_length, _reserved, _key, _unique = AXLF.unpack_from(head)
    if magic != MAGIC:
        raise ValueError(f"not an xclbin2 file: magic {magic!r}, not {MAGIC!r}")
    (length, timestamp, rom_timestamp, patch, major, minor, mode, _actions, interface, vbnv_raw,
     uuid_raw, _debug, count) = HEADER.unpack_from(head, AXLF.size)
    if length > size:
        raise ValueError(f"xclbin header length {length} is past the end of the "
                         f"{size}-byte file (truncated)")
    if length < SECTIONS_OFFSET:
        raise ValueError(f"xclbin header length {length} is shorter than the header itself")
    if count > MAX_SECTIONS:
        raise ValueError(f"xclbin declares {count} sections, over XRT's limit {MAX_SECTIONS}")
    table_end = SECTIONS_OFFSET + count * SECTION.size
    if table_end > length:
        raise ValueError(f"xclbin section table ({count} sections) ends at byte {table_end}, "
                         f"past the header length {length}")
    if uuid_raw == _ZERO_UUID:
        raise ValueError("xclbin has no UUID (all zero): the function it holds cannot be named")
    vbnv = _c_string(vbnv_raw, "platform VBNV")
    if not vbnv:
        raise ValueError("xclbin names no target platform (empty VBNV)")
    table = _read_exact(stream, table_end - SECTIONS_OFFSET, size - SECTIONS_OFFSET,
                        "the section table")
    sections = tuple(_section(table, i, table_end, length) for i in range(count))
    layout = next((s for s in sections if s.kind == IP_LAYOUT), None)
    return XclbinImage(
        uuid=uuid_raw.hex(), platform_vbnv=vbnv,
        interface_uuid=None if interface == _ZERO_UUID else interface.hex(),
        length=length, timestamp=timestamp, feature_rom_timestamp=rom_timestamp,
        version=(major, minor, patch), mode=mode,
        signature_length=signature_length, sections=sections,
        compute_units=None if layout is None else _compute_units(stream, layout))


def parse_xclbin(data: bytes) -> XclbinImage:
    """:func:`read_xclbin` on bytes already in memory (tests, small images)."""
    return read_xclbin(io.BytesIO(data), len(data))


def _section(table: bytes, index: int, table_end: int, length: int) -> Section:
    kind, name_raw, offset, size = SECTION.unpack_from(table, index * SECTION.size)
    name = _c_string(name_raw, f"section {index} name")
    if offset + size > length:
        raise ValueError(f"xclbin section {index} ({name!r}, kind {kind}) spans bytes "
                         f"{offset}..{offset + size}, past the header length {length}")
    if size and offset < table_end:
        raise ValueError(f"xclbin section {index} ({name!r}) starts at byte {offset}, "
                         f"inside the header or section table (which end at {table_end})")
    return Section(kind=kind, name=name, offset=offset, size=size)


def _compute_units(stream: BinaryIO, layout: Section) -> int:
    """The ``IP_KERNEL`` entries of ``layout``, read a chunk at a time: the count is checked
    against the section's size (itself inside the file) before any entry is read."""
    where = f"IP_LAYOUT section {layout.name!r}"
    if layout.size < 4:
        raise ValueError(f"xclbin {where} is {layout.size} bytes, too short for its count")
    stream.seek(layout.offset)
    head = _read_exact(stream, min(layout.size, IP_LAYOUT_HEAD), layout.size, where)
    (entries,) = struct.unpack_from("<i", head)
    if entries < 0:
        raise ValueError(f"xclbin {where} declares {entries} IPs")
    if entries > MAX_IP_ENTRIES:
        raise ValueError(f"xclbin {where} declares {entries} IPs, over the bound "
                         f"{MAX_IP_ENTRIES}: a corrupt section")
    needed = IP_LAYOUT_HEAD + entries * IP_DATA.size
    if entries and needed > layout.size:
        raise ValueError(f"xclbin {where} declares {entries} IPs ({needed} bytes), more "
                         f"than its {layout.size} bytes hold")
    kernels = 0
    left = layout.size - IP_LAYOUT_HEAD
    for first in range(0, entries, _IP_CHUNK):
        chunk = min(_IP_CHUNK, entries - first)
        data = _read_exact(stream, chunk * IP_DATA.size, left, f"{where} entries")
        left -= len(data)
        kernels += sum(1 for (kind, *_rest) in IP_DATA.iter_unpack(data) if kind == IP_KERNEL)
    return kernels


def _c_string(raw: bytes, what: str) -> str:
    text = raw.split(b"\0", 1)[0]
    try:
        return text.decode("ascii")
    except UnicodeDecodeError:
        raise ValueError(f"xclbin {what} is not ASCII: {text[:40]!r}") from None


def _read_exact(stream: BinaryIO, count: int, available: int, what: str) -> bytes:
    return read_exact(stream, count, available, what, "xclbin")
