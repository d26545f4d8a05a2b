"""GBS and xclbin files built from their documented layouts, for tests and the demo.

The layouts are the ones :mod:`plugin.programming.gbs` and :mod:`plugin.programming.xclbin`
cite (OPAE's ``bitstream.c``, XRT's ``xclbin.h``); these builders write them with ``struct``
independently of the readers' own ``Struct`` objects, so a mistake in one shows in the other.
The GBS defaults are IDs from OPAE's own test fixtures (an NLB0 AFU on a Skylake FME
interface); the xclbin UUIDs are arbitrary.
"""

from __future__ import annotations

import json
import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from compat_tests.fake_alveo import DEFAULT_SHELL, DEFAULT_TIMESTAMP

GBS_GUID_TEXT = "58656F6E-4650-4741-B747-425376303031"
GBS_MAGIC_NO = 488605312
NLB0_AFU_ID = "d8424dc4-a4a3-c413-f89e-433683f9040b"
NLB3_AFU_ID = "f7df405c-bd7a-cf72-22f1-44b0b93acd18"
SKX_INTERFACE_ID = "1a422218-6dba-448e-b302-425cbcde1406"

XCLBIN_SHELL = DEFAULT_SHELL  # the shell fake_alveo's cards report
XCLBIN_INTERFACE = "15a6b4a4-1eb2-e1b7-5f05-ce8a63bb1e53"
XCLBIN_UUID = "5c4ed2a3-4c52-4d6e-9d16-7a8d8b2bc7e0"


def gbs_metadata(interface_id: str = SKX_INTERFACE_ID,
                 afu_ids: Sequence[str] = (NLB0_AFU_ID,), name: str = "nlb_400",
                 version: int = 1, contexts: int | Sequence[int] = 1) -> dict[str, object]:
    """The JSON metadata OPAE's packager writes (``version`` 1 layout); ``contexts`` is each
    cluster's ``total-contexts`` (one number for all, or one per AFU ID)."""
    counts = [contexts] * len(afu_ids) if isinstance(contexts, int) else list(contexts)
    return {
        "version": version,
        "platform-name": "pcie/ccip",
        "afu-image": {
            "magic-no": GBS_MAGIC_NO,
            "interface-uuid": interface_id,
            "clock-frequency-high": 312,
            "clock-frequency-low": 156,
            "power": 50,
            "accelerator-clusters": [
                {"name": name, "total-contexts": count, "accelerator-type-uuid": afu}
                for afu, count in zip(afu_ids, counts, strict=True)],
        },
    }


def build_gbs(metadata: dict[str, object] | bytes | None = None,
              bitstream: bytes = b"\x5a" * 4096, **kwargs: object) -> bytes:
    """GUID, metadata length (uint32 LE), metadata, bitstream; ``kwargs`` go to gbs_metadata."""
    if metadata is None:
        metadata = gbs_metadata(**kwargs)  # type: ignore[arg-type]
    raw = metadata if isinstance(metadata, bytes) else json.dumps(metadata).encode()
    guid = uuid.UUID(GBS_GUID_TEXT).bytes  # uuid_parse order: the string's bytes in order
    return guid + struct.pack("<I", len(raw)) + raw + bitstream


@dataclass
class XclbinSection:
    """One section to write: its kind (``axlf_section_kind``), name and data."""

    kind: int
    name: str
    data: bytes


@dataclass
class XclbinSpec:
    """What an xclbin says about itself; :func:`build_xclbin` lays it out."""

    uuid: str = XCLBIN_UUID
    vbnv: str = XCLBIN_SHELL
    interface_uuid: str | None = XCLBIN_INTERFACE
    timestamp: int = 1_700_000_000
    feature_rom_timestamp: int = int(DEFAULT_TIMESTAMP)
    version: tuple[int, int, int] = (2, 16, 0)
    mode: int = 1  # XCLBIN_PR
    sections: list[XclbinSection] = field(default_factory=lambda: [
        XclbinSection(0, "bit", b"\xa5" * 2048),
        XclbinSection(6, "mem_topology", bytes(48)),
    ])


IP_LAYOUT = 8
IP_MB, IP_KERNEL, IP_DDR4_CONTROLLER = 0, 1, 3  # XRT's enum IP_TYPE


def ip_layout(kernels: int, others: Sequence[int] = (IP_MB, IP_DDR4_CONTROLLER),
              count: int | None = None) -> XclbinSection:
    """An ``IP_LAYOUT`` section: ``kernels`` IP_KERNEL entries (compute units) among IPs of
    the types in ``others``; ``count`` overrides ``m_count`` (for malformed sections)."""
    types = [*others[:1], *[IP_KERNEL] * kernels, *others[1:]]
    data = struct.pack("<i", len(types) if count is None else count) + bytes(4)
    for index, kind in enumerate(types):
        name = f"k{index}:k{index}_1" if kind == IP_KERNEL else f"ip{index}"
        data += struct.pack("<IIQ", kind, 0, 0x1800000 + 0x10000 * index)
        data += name.encode().ljust(64, b"\0")
    return XclbinSection(IP_LAYOUT, "ip_layout", data)


def with_compute_units(kernels: int, spec: XclbinSpec | None = None) -> XclbinSpec:
    """``spec`` (the default one) with an ``IP_LAYOUT`` of ``kernels`` compute units."""
    spec = spec or XclbinSpec()
    spec.sections = [*spec.sections, ip_layout(kernels)]
    return spec


def build_xclbin(spec: XclbinSpec | None = None) -> bytes:
    """An ``axlf``: magic, header, section table, then each section's data 8-byte aligned."""
    spec = spec or XclbinSpec()
    header_end = 304 + 152
    table_end = header_end + 40 * len(spec.sections)
    placed: list[tuple[XclbinSection, int]] = []
    offset = table_end
    body = b""
    for section in spec.sections:
        offset += -offset % 8
        body += bytes(offset - table_end - len(body)) + section.data
        placed.append((section, offset))
        offset += len(section.data)
    length = table_end + len(body)
    interface = uuid.UUID(spec.interface_uuid).bytes if spec.interface_uuid else bytes(16)
    major, minor, patch = spec.version
    out = b"xclbin2\0" + struct.pack("<i", -1) + b"\xff" * 28 + bytes(256)
    out += struct.pack("<Q", 0x1234)  # m_uniqueId
    out += struct.pack("<QQQ", length, spec.timestamp, spec.feature_rom_timestamp)
    out += struct.pack("<HBBHH", patch, major, minor, spec.mode, 0)
    out += interface + spec.vbnv.encode().ljust(64, b"\0")
    out += uuid.UUID(spec.uuid).bytes + bytes(16)  # uuid, m_debug_bin
    out += struct.pack("<I", len(spec.sections)) + bytes(4)
    assert len(out) == header_end
    for section, where in placed:
        out += struct.pack("<I", section.kind) + section.name.encode().ljust(16, b"\0")
        out += bytes(4) + struct.pack("<QQ", where, len(section.data))
    return out + body


def write_image(directory: Path, name: str, data: bytes) -> Path:
    """``data`` as ``directory/name`` (parents created): a library entry."""
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path
