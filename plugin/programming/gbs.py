"""Intel OPAE green bitstreams (GBS): the header and metadata, checked before a card is touched.

Layout, as OPAE reads it (OFS/opae-sdk ``opae-libs/libbitstream/bitstream.c`` at commit
4d1089ce34550b06f38eb28f422312780f2a7253, ``opae_resolve_bitstream``, the library
``fpgaconf`` loads with; the same layout in ``libopae/plugins/xfpga/bitstream.c`` at
8851c9af617d8e8149da5e5b7be2287f2981c903, ``check_bitstream_guid``,
``get_bitstream_header_len``)::

    offset 0   16 bytes  METADATA_GUID "58656F6E-4650-4741-B747-425376303031", stored in
                         uuid_parse order (the bytes ``XeonFPGA\\xb7GBSv001``)
    offset 16  uint32    JSON metadata length, host (little-endian) order
    offset 20  n bytes   JSON metadata
    offset 20+n          the raw partial bitstream (the "rbf"), to the end of the file

The metadata, version 1 (``opae-libs/libbitstream/metadatav1.c`` at
b95ab6fdcbb9455c8b3ac8a61b71b4626217fa12; 640 and 650 are accepted aliases of 1)::

    {"version": 1, "platform-name": "...",
     "afu-image": {"magic-no": 488605312, "interface-uuid": "<uuid>",
                   "clock-frequency-high": ..., "clock-frequency-low": ..., "power": ...,
                   "accelerator-clusters": [{"name": "...", "total-contexts": 1,
                                             "accelerator-type-uuid": "<uuid>"}]}}

``interface-uuid`` is the PR interface the image was built for (the FME's
``pr/interface_id``, DFL's region ``compat_id``); each cluster's ``accelerator-type-uuid``
is an AFU ID, what the port's ``afu_id`` reads once the image is loaded. This reader
requires what ``metadatav1.c`` requires (``magic-no`` equal to 0x1d1f8680, the interface
UUID, each cluster's name, context count and type UUID; the counts are kept, the first
cluster's being how many users the port's AFU serves), treats the clock and power keys as
optional as OPAE does, and refuses further what it cannot vouch for before a load: no
cluster at all (no AFU ID to check against the port) and the deprecated legacy format
(no metadata; it starts with the magic number itself).

IDs are kept as 32 lower-case hex digits, the spelling sysfs uses (see :mod:`.ids`).
"""

from __future__ import annotations

import io
import json
import math
import struct
from dataclasses import dataclass
from typing import BinaryIO

from plugin.programming.ids import dashed, same_id, sysfs_id, uuid_text_to_id
from plugin.programming.reading import read_exact

GBS_GUID = bytes.fromhex("58656F6E46504741B747425376303031")
PREFIX = struct.Struct("<16sI")
GBS_MAGIC_NO = 0x1D1F8680  # FPGA_GBS_6_3_0_MAGIC, OPAE_LEGACY_BITSTREAM_MAGIC
METADATA_VERSIONS = {1: 1, 640: 1, 650: 1}  # BBS 6.4.0/6.5.0-era images wrote 640/650
# The metadata is a few hundred bytes in every image OPAE's packager writes; the bound only
# stops a corrupt length from making the reader allocate up to 4 GiB.
MAX_METADATA_BYTES = 1 << 20


@dataclass(frozen=True)
class GbsImage:
    """What a GBS file says about itself; IDs as 32 lower-case hex digits."""

    metadata_version: int
    platform_name: str | None
    interface_id: str
    afu_ids: tuple[str, ...]
    name: str
    magic_no: int
    clock_frequency_high: float | None
    clock_frequency_low: float | None
    power: float | None
    bitstream_offset: int
    bitstream_length: int
    contexts: tuple[int, ...] = ()
    """Each cluster's ``total-contexts``, in the order of :attr:`afu_ids`: how many users
    (OPAE shared opens) the cluster's AFU serves at once."""

    @property
    def afu_id(self) -> str:
        """The first cluster's AFU ID: the one a port reports after the load."""
        return self.afu_ids[0]

    @property
    def total_contexts(self) -> int | None:
        """The first cluster's ``total-contexts``: the port's AFU is that cluster's, so this
        is how many users the function a port holds after the load serves (what
        ``--dra-share intel=image`` publishes)."""
        return self.contexts[0] if self.contexts else None

    def fits_interface(self, sysfs_text: str | None) -> bool:
        """True when the FME's ``pr/interface_id`` (or region ``compat_id``) is this image's."""
        return same_id(self.interface_id, sysfs_text)

    def check_interface(self, sysfs_text: str | None) -> None:
        """Raise ValueError, naming both IDs, unless the device's interface is this image's."""
        if not self.fits_interface(sysfs_text):
            shown = sysfs_id(sysfs_text) or repr((sysfs_text or "")[:40])
            raise ValueError(f"GBS {self.name or '(unnamed)'} was built for interface "
                             f"{dashed(self.interface_id)}; the device's is {shown}")

    def holds(self, afu_id: str) -> bool:
        """True when ``afu_id`` (any spelling) is one of this image's AFU IDs."""
        value = sysfs_id(afu_id)
        return value is not None and value in self.afu_ids

    def loaded_on(self, sysfs_afu_id: str | None) -> bool:
        """True when a port's ``afu_id`` shows this image's function is already loaded."""
        return same_id(self.afu_id, sysfs_afu_id)


def read_gbs(stream: BinaryIO, size: int) -> GbsImage:
    """Parse the header and metadata of the ``size``-byte GBS open in ``stream`` at offset 0.

    Reads only the 20-byte prefix and the metadata, never the bitstream. Raises ValueError
    naming the problem for anything OPAE would refuse or this reader cannot vouch for.
    """
    prefix = _read_exact(stream, PREFIX.size, size, "the 20-byte header")
    guid, length = PREFIX.unpack(prefix)
    if guid != GBS_GUID and struct.unpack_from("<I", guid)[0] == GBS_MAGIC_NO:
        raise ValueError("a legacy GBS without metadata (OPAE deprecated the format): its "
                         "AFU ID cannot be checked; repackage it with OPAE's packager")
    if guid != GBS_GUID:
        raise ValueError(f"not a GBS file: the first 16 bytes are {guid.hex()}, "
                         f"not the GBS GUID {GBS_GUID.hex()}")
    if length == 0:
        raise ValueError("GBS has no metadata (length 0): its interface and AFU IDs are unknown")
    if length > MAX_METADATA_BYTES:
        raise ValueError(f"GBS metadata length {length} is over the {MAX_METADATA_BYTES}-byte "
                         f"bound: a corrupt header")
    if PREFIX.size + length > size:
        raise ValueError(f"GBS metadata length {length} runs past the end of the "
                         f"{size}-byte file")
    raw = _read_exact(stream, length, size - PREFIX.size, "the metadata")
    fields = _metadata(raw)
    offset = PREFIX.size + length
    return _image(fields, offset, size - offset)


def parse_gbs(data: bytes) -> GbsImage:
    """:func:`read_gbs` on bytes already in memory (tests, small images)."""
    return read_gbs(io.BytesIO(data), len(data))


def _read_exact(stream: BinaryIO, count: int, available: int, what: str) -> bytes:
    return read_exact(stream, count, available, what, "GBS")


def _reject_constant(name: str) -> float:
    raise ValueError(f"GBS metadata is not JSON: {name} is not a JSON number")


def _metadata(raw: bytes) -> dict[str, object]:
    # Packagers may pad the metadata with NULs; json-c stops at the first one too.
    text_bytes = raw.split(b"\0", 1)[0]
    try:
        text = text_bytes.decode("utf-8")
        value = json.loads(text, parse_constant=_reject_constant)
    except UnicodeDecodeError as exc:
        raise ValueError(f"GBS metadata is not UTF-8 text: {exc.reason} at byte "
                         f"{exc.start}") from None
    except RecursionError:
        raise ValueError("GBS metadata is not usable JSON: nested too deeply") from None
    except ValueError as exc:
        raise ValueError(f"GBS metadata is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"GBS metadata is not a JSON object: {type(value).__name__}")
    return value


def _image(root: dict[str, object], offset: int, length: int) -> GbsImage:
    version = root.get("version")
    if "version" not in root:
        raise ValueError("GBS metadata has no \"version\"")
    if isinstance(version, bool) or not isinstance(version, int):
        raise ValueError(f"GBS metadata \"version\" is not an integer: {version!r:.40}")
    if version not in METADATA_VERSIONS:
        raise ValueError(f"GBS metadata version {version} is not one OPAE reads (1, or its "
                         f"aliases 640 and 650)")
    platform = root.get("platform-name")
    if platform is not None and not isinstance(platform, str):
        raise ValueError("GBS \"platform-name\" is not a string")
    afu = root.get("afu-image")
    if not isinstance(afu, dict):
        raise ValueError("GBS metadata has no \"afu-image\" object")
    magic = afu.get("magic-no")
    if isinstance(magic, bool) or not isinstance(magic, int):
        raise ValueError(f"GBS \"afu-image\" has no integer \"magic-no\": {magic!r:.40}")
    if magic != GBS_MAGIC_NO:
        raise ValueError(f"GBS \"magic-no\" is {magic}, not {GBS_MAGIC_NO} "
                         f"({GBS_MAGIC_NO:#x}), the only one OPAE loads")
    if "interface-uuid" not in afu:
        raise ValueError("GBS \"afu-image\" has no \"interface-uuid\"")
    interface = uuid_text_to_id(afu["interface-uuid"], "GBS \"interface-uuid\"")
    clusters = afu.get("accelerator-clusters")
    if not isinstance(clusters, list):
        raise ValueError("GBS \"afu-image\" has no \"accelerator-clusters\" list")
    if not clusters:
        raise ValueError("GBS \"accelerator-clusters\" is empty: the image names no AFU")
    afu_ids: list[str] = []
    names: list[str] = []
    contexts: list[int] = []
    for index, cluster in enumerate(clusters):
        where = f"GBS accelerator cluster {index}"
        if not isinstance(cluster, dict):
            raise ValueError(f"{where} is not an object")
        if "accelerator-type-uuid" not in cluster:
            raise ValueError(f"{where} has no \"accelerator-type-uuid\"")
        afu_ids.append(uuid_text_to_id(cluster["accelerator-type-uuid"],
                                       f"{where} \"accelerator-type-uuid\""))
        name = cluster.get("name")
        if not isinstance(name, str):
            raise ValueError(f"{where} has no string \"name\"")
        contexts_value = cluster.get("total-contexts")
        if isinstance(contexts_value, bool) or not isinstance(contexts_value, int):
            raise ValueError(f"{where} has no integer \"total-contexts\"")
        names.append(name)
        contexts.append(contexts_value)
    return GbsImage(
        metadata_version=METADATA_VERSIONS[version], platform_name=platform,
        interface_id=interface, afu_ids=tuple(afu_ids),
        name=names[0], magic_no=magic,
        clock_frequency_high=_number(afu, "clock-frequency-high"),
        clock_frequency_low=_number(afu, "clock-frequency-low"),
        power=_number(afu, "power"),
        bitstream_offset=offset, bitstream_length=length, contexts=tuple(contexts))


def _number(afu: dict[str, object], key: str) -> float | None:
    """An optional numeric field; present but not a finite number is an error."""
    if key not in afu:
        return None
    value = afu[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"GBS \"{key}\" is not a number: {value!r:.40}")
    try:
        number = float(value)
    except OverflowError:
        raise ValueError(f"GBS \"{key}\" is out of range: {value!r:.40}") from None
    if not math.isfinite(number):
        raise ValueError(f"GBS \"{key}\" is not a finite number: {value!r:.40}")
    return number
