"""GBS and xclbin readers and the image library: layouts, refusals, fuzzing, containment."""

from __future__ import annotations

import contextlib
import io
import json
import os
import struct
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compat_tests.fpga_images import (
    GBS_MAGIC_NO,
    NLB0_AFU_ID,
    NLB3_AFU_ID,
    SKX_INTERFACE_ID,
    XCLBIN_INTERFACE,
    XCLBIN_SHELL,
    XCLBIN_UUID,
    XclbinSection,
    XclbinSpec,
    build_gbs,
    build_xclbin,
    gbs_metadata,
    write_image,
)
from plugin.programming import gbs as gbs_module
from plugin.programming.gbs import GbsImage, parse_gbs, read_gbs
from plugin.programming.ids import dashed
from plugin.programming.library import DEFAULT_MAX_BYTES, ImageLibrary
from plugin.programming.xclbin import (
    HEADER,
    MAX_SECTIONS,
    SECTION,
    SECTIONS_OFFSET,
    parse_xclbin,
    read_xclbin,
)

SKX_HEX = SKX_INTERFACE_ID.replace("-", "")
NLB0_HEX = NLB0_AFU_ID.replace("-", "")
FUZZ = settings(max_examples=300, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


class BoundedStream(io.BytesIO):
    """A file that fails the test if a reader asks for bytes past its end or reads too much."""

    def __init__(self, data: bytes, budget: int) -> None:
        super().__init__(data)
        self.size = len(data)
        self.budget = budget
        self.total = 0

    def read(self, n: int | None = -1) -> bytes:
        assert n is not None and n >= 0, "a header reader must never read to the end"
        assert self.tell() + n <= self.size, f"read of {n} at {self.tell()} past {self.size}"
        self.total += n
        assert self.total <= self.budget, f"read {self.total} bytes, budget {self.budget}"
        return super().read(n)


def _metadata_with(**changes: object) -> dict[str, object]:
    meta = gbs_metadata()
    afu = dict(meta["afu-image"])  # type: ignore[arg-type]
    for key, value in changes.items():
        if key.startswith("afu_"):
            name = key[4:].replace("_", "-")
            if value is None:
                afu.pop(name, None)
            else:
                afu[name] = value
        elif value is None:
            meta.pop(key, None)
        else:
            meta[key] = value
    meta["afu-image"] = afu
    return meta


# ---------------------------------------------------------------- GBS


def test_gbs_guid_is_stored_in_uuid_parse_order():
    data = build_gbs()
    assert data[:16] == b"XeonFPGA\xb7GBSv001"
    assert data[:16] == gbs_module.GBS_GUID


def test_gbs_round_trip():
    bitstream = bytes(range(256)) * 10
    data = build_gbs(bitstream=bitstream, afu_ids=(NLB0_AFU_ID.upper(), NLB3_AFU_ID),
                     interface_id=SKX_INTERFACE_ID.upper(), name="nlb_400")
    image = parse_gbs(data)
    (length,) = struct.unpack_from("<I", data, 16)
    assert image == GbsImage(
        metadata_version=1, platform_name="pcie/ccip", interface_id=SKX_HEX,
        afu_ids=(NLB0_HEX, NLB3_AFU_ID.replace("-", "")), name="nlb_400",
        magic_no=GBS_MAGIC_NO, clock_frequency_high=312.0, clock_frequency_low=156.0,
        power=50.0, bitstream_offset=20 + length, bitstream_length=len(bitstream),
        contexts=(1, 1))
    assert data[image.bitstream_offset:] == bitstream
    assert image.afu_id == NLB0_HEX


def test_gbs_optional_fields_and_nul_padding():
    meta = _metadata_with(afu_power=None, afu_clock_frequency_high=None,
                          afu_clock_frequency_low=None)
    raw = json.dumps(meta).encode() + b"\0\0\0"
    image = parse_gbs(build_gbs(raw, bitstream=b""))
    assert (image.power, image.clock_frequency_high, image.bitstream_length) == (None, None, 0)


@pytest.mark.parametrize("version", [640, 650])
def test_gbs_metadata_version_aliases_of_1(version):
    # metadatav1.c: BBS 6.4.0/6.5.0-era images wrote 640/650 for version 1.
    assert parse_gbs(build_gbs(version=version)).metadata_version == 1


def test_gbs_platform_name_is_optional():
    assert parse_gbs(build_gbs(_metadata_with(**{"platform-name": None}))).platform_name is None


def _gbs_with_length(length: int, body: bytes = b"{}") -> bytes:
    return gbs_module.GBS_GUID + struct.pack("<I", length) + body


GBS_REFUSALS = [
    ("wrong magic", b"YeonFPGA\xb7GBSv001" + build_gbs()[16:], "not a GBS file"),
    ("legacy format", struct.pack("<II", GBS_MAGIC_NO, 0) + bytes(16) + b"rbf",
     "a legacy GBS without metadata"),
    ("empty file", b"", "truncated: the 20-byte header"),
    ("truncated header", build_gbs()[:19], "truncated: the 20-byte header"),
    ("no metadata", _gbs_with_length(0), "no metadata"),
    ("length past end", _gbs_with_length(100), "runs past the end"),
    ("length over bound", _gbs_with_length(0xFFFFFFFF), "over the 1048576-byte bound"),
    ("not utf-8", _gbs_with_length(2, b"\xff\xfe"), "not UTF-8"),
    ("not json", build_gbs(b"{version: 1"), "not JSON"),
    ("nan", build_gbs(b'{"version": NaN}'), "not JSON: NaN"),
    ("not an object", build_gbs(b"[1, 2]"), "not a JSON object: list"),
    ("deep nesting", build_gbs(b"[" * 100_000 + b"]" * 100_000), "JSON"),
    ("no version", build_gbs(_metadata_with(version=None)), 'no "version"'),
    ("version string", build_gbs(_metadata_with(version="1")), '"version" is not an integer'),
    ("version bool", build_gbs(_metadata_with(version=True)), '"version" is not an integer'),
    ("version 2", build_gbs(version=2), "metadata version 2 is not one OPAE reads"),
    ("platform not string", build_gbs(_metadata_with(**{"platform-name": 3})),
     '"platform-name" is not a string'),
    ("no afu-image", build_gbs({"version": 1}), 'no "afu-image"'),
    ("no magic-no", build_gbs(_metadata_with(afu_magic_no=None)), 'no integer "magic-no"'),
    ("wrong magic-no", build_gbs(_metadata_with(afu_magic_no=1)), '"magic-no" is 1'),
    ("no interface", build_gbs(_metadata_with(afu_interface_uuid=None)),
     'no "interface-uuid"'),
    ("interface not uuid", build_gbs(_metadata_with(afu_interface_uuid="1a422218")),
     '"interface-uuid" \'1a422218\' is not a UUID'),
    ("interface undashed", build_gbs(_metadata_with(afu_interface_uuid=SKX_HEX)),
     "is not a UUID"),
    ("interface newline", build_gbs(_metadata_with(afu_interface_uuid=SKX_INTERFACE_ID + "\n")),
     "is not a UUID"),
    ("interface number", build_gbs(_metadata_with(afu_interface_uuid=7)), "is not a string"),
    ("no clusters", build_gbs(_metadata_with(afu_accelerator_clusters=None)),
     'no "accelerator-clusters"'),
    ("empty clusters", build_gbs(_metadata_with(afu_accelerator_clusters=[])),
     "names no AFU"),
    ("cluster not object", build_gbs(_metadata_with(afu_accelerator_clusters=["x"])),
     "cluster 0 is not an object"),
    ("cluster without uuid", build_gbs(_metadata_with(afu_accelerator_clusters=[{"name": "a"}])),
     'cluster 0 has no "accelerator-type-uuid"'),
    ("afu id malformed", build_gbs(afu_ids=(NLB0_AFU_ID, "d8424dc4-a4a3-c413-f89e-433683f9040")),
     'cluster 1 "accelerator-type-uuid"'),
    ("name not string", build_gbs(_metadata_with(afu_accelerator_clusters=[
        {"accelerator-type-uuid": NLB0_AFU_ID, "name": 3, "total-contexts": 1}])),
     'cluster 0 has no string "name"'),
    ("no name", build_gbs(_metadata_with(afu_accelerator_clusters=[
        {"accelerator-type-uuid": NLB0_AFU_ID, "total-contexts": 1}])),
     'cluster 0 has no string "name"'),
    ("no contexts", build_gbs(_metadata_with(afu_accelerator_clusters=[
        {"accelerator-type-uuid": NLB0_AFU_ID, "name": "nlb"}])),
     'cluster 0 has no integer "total-contexts"'),
    ("power string", build_gbs(_metadata_with(afu_power="50")), '"power" is not a number'),
    ("clock huge", build_gbs(_metadata_with(afu_clock_frequency_high=10**400)),
     '"clock-frequency-high" is out of range'),
    ("power infinite", build_gbs(json.dumps(gbs_metadata()).replace('"power": 50', '"power": 1e999')
                                 .encode()),
     '"power" is not a finite number'),
]


@pytest.mark.parametrize(("data", "message"), [(d, m) for _, d, m in GBS_REFUSALS],
                         ids=[i for i, _, _ in GBS_REFUSALS])
def test_gbs_refusals_name_the_problem(data, message):
    with pytest.raises(ValueError) as caught:
        parse_gbs(data)
    assert message in str(caught.value)


def test_gbs_reads_only_the_header():
    data = build_gbs(bitstream=b"\0" * 1_000_000)
    (length,) = struct.unpack_from("<I", data, 16)
    stream = BoundedStream(data, budget=20 + length)
    image = read_gbs(stream, len(data))
    assert stream.total == 20 + length
    assert image.bitstream_length == 1_000_000


def test_gbs_checks_against_sysfs_spellings():
    image = parse_gbs(build_gbs())
    assert image.fits_interface(SKX_HEX + "\n")  # DFL compat_id, intel-fpga pr/interface_id
    assert image.fits_interface(SKX_INTERFACE_ID.upper())
    assert not image.fits_interface("0" * 32)
    assert not image.fits_interface("garbage")
    assert not image.fits_interface(None)
    image.check_interface(SKX_HEX)
    with pytest.raises(ValueError) as caught:
        image.check_interface("00000000000000000000000000000001\n")
    assert SKX_INTERFACE_ID in str(caught.value)
    assert "00000000000000000000000000000001" in str(caught.value)
    assert image.loaded_on(NLB0_HEX + "\n")  # a DFL port's afu_id
    assert not image.loaded_on(NLB3_AFU_ID.replace("-", ""))
    assert image.holds(NLB0_AFU_ID.upper())
    assert not image.holds("not-an-id")
    assert dashed(image.interface_id) == SKX_INTERFACE_ID


# ---------------------------------------------------------------- xclbin


def test_xclbin_struct_sizes_are_xclbin_h():
    assert (HEADER.size, SECTION.size, SECTIONS_OFFSET) == (152, 40, 456)
    data = build_xclbin(XclbinSpec(sections=[XclbinSection(0, "bit", b"")]))
    assert len(data) == 496  # sizeof(struct axlf) with its one inline section header


def test_xclbin_round_trip():
    data = build_xclbin()
    image = parse_xclbin(data)
    assert image.uuid == XCLBIN_UUID.replace("-", "")
    assert image.platform_vbnv == XCLBIN_SHELL
    assert image.interface_uuid == XCLBIN_INTERFACE.replace("-", "")
    assert image.length == len(data)
    assert (image.version, image.mode, image.signature_length) == ((2, 16, 0), 1, -1)
    assert (image.timestamp, image.feature_rom_timestamp) == (1_700_000_000, 1605029394)
    assert [(s.kind, s.name, s.size) for s in image.sections] == [
        (0, "bit", 2048), (6, "mem_topology", 48)]
    bit = image.sections[0]
    assert data[bit.offset:bit.offset + bit.size] == b"\xa5" * 2048
    assert image.has_bitstream()
    # Fields at the offsets xclbin.h gives, read independently of the parser.
    assert data[:8] == b"xclbin2\0"
    assert struct.unpack_from("<Q", data, 304)[0] == len(data)
    assert data[352:352 + len(XCLBIN_SHELL)] == XCLBIN_SHELL.encode()
    assert data[416:432].hex() == image.uuid
    assert struct.unpack_from("<I", data, 448)[0] == 2


def test_xclbin_without_interface_uuid_matches_on_vbnv():
    image = parse_xclbin(build_xclbin(XclbinSpec(interface_uuid=None)))
    assert image.interface_uuid is None
    assert image.fits_interface(None)
    image.check_target(XCLBIN_SHELL + "\n", None)


def test_xclbin_target_checks():
    image = parse_xclbin(build_xclbin())
    interfaces = f"0123456789abcdef0123456789abcdef\n{XCLBIN_INTERFACE.replace('-', '')}\n"
    image.check_target(XCLBIN_SHELL, interfaces)
    with pytest.raises(ValueError, match="targets platform"):
        image.check_target("xilinx_u280_xdma_201920_3", interfaces)
    with pytest.raises(ValueError, match=f"built for interface {XCLBIN_INTERFACE}"):
        image.check_target(XCLBIN_SHELL, "0123456789abcdef0123456789abcdef")
    assert image.loaded_on(XCLBIN_UUID + "\n")  # XRT's xclbinuuid prints it dashed
    assert image.holds(XCLBIN_UUID.replace("-", "").upper())
    assert not image.loaded_on("")


def _patched(data: bytes, offset: int, fmt: str, *values: object) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, *values)
    return bytes(out)


_GOOD = build_xclbin()
XCLBIN_REFUSALS = [
    ("bad magic", b"xclbin0\0" + _GOOD[8:], "not an xclbin2 file"),
    ("truncated header", _GOOD[:455], "truncated: the 456-byte header"),
    ("length past file", _patched(_GOOD, 304, "<Q", len(_GOOD) + 1), "past the end"),
    ("file cut short", _GOOD[:-1], "past the end"),
    ("length inside header", _patched(_GOOD, 304, "<Q", 100), "shorter than the header"),
    ("too many sections", _patched(_GOOD, 448, "<I", MAX_SECTIONS + 1), "over XRT's limit"),
    ("table past length", _patched(_GOOD, 448, "<I", 1000), "past the header length"),
    ("section past length", _patched(_GOOD, 456 + 24 + 8, "<Q", 1 << 40),
     "section 0 ('bit', kind 0) spans"),
    ("section offset overflow", _patched(_GOOD, 456 + 40 + 24, "<Q", (1 << 64) - 1),
     "section 1 ('mem_topology', kind 6) spans"),
    ("section inside table", _patched(_GOOD, 456 + 24, "<Q", 460), "inside the header"),
    ("zero uuid", _patched(_GOOD, 416, "16s", bytes(16)), "has no UUID"),
    ("empty vbnv", _patched(_GOOD, 352, "64s", bytes(64)), "empty VBNV"),
    ("vbnv not ascii", _patched(_GOOD, 352, "4s", b"\xff\xfe\0\0"), "VBNV is not ASCII"),
    ("section name not ascii", _patched(_GOOD, 460, "2s", b"\xc3\xa9"),
     "section 0 name is not ASCII"),
]


@pytest.mark.parametrize(("data", "message"), [(d, m) for _, d, m in XCLBIN_REFUSALS],
                         ids=[i for i, _, _ in XCLBIN_REFUSALS])
def test_xclbin_refusals_name_the_problem(data, message):
    with pytest.raises(ValueError) as caught:
        parse_xclbin(data)
    assert message in str(caught.value)


def test_xclbin_reads_only_header_and_table():
    data = build_xclbin(XclbinSpec(sections=[XclbinSection(0, "bit", b"\1" * 1_000_000)]))
    stream = BoundedStream(data, budget=456 + 40)
    image = read_xclbin(stream, len(data))
    assert stream.total == 456 + 40
    assert image.sections[0].size == 1_000_000


# ---------------------------------------------------------------- fuzzing


@FUZZ
@given(st.binary(max_size=2048))
def test_fuzz_random_bytes_only_value_error(data):
    for parse in (parse_gbs, parse_xclbin):
        with contextlib.suppress(ValueError):
            parse(data)


def _mutate(data: bytes, draw: st.DrawFn, window: int) -> bytes:
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 8))):
        choice = draw(st.sampled_from(["flip", "cut", "insert", "word"]))
        position = draw(st.integers(0, min(window, len(out))))
        if choice == "flip" and position < len(out):
            out[position] = draw(st.integers(0, 255))
        elif choice == "cut":
            del out[position:position + draw(st.integers(1, 64))]
        elif choice == "insert":
            out[position:position] = draw(st.binary(min_size=1, max_size=16))
        elif position + 8 <= len(out):
            out[position:position + 8] = draw(st.binary(min_size=8, max_size=8))
    return bytes(out)


@FUZZ
@given(st.data())
def test_fuzz_mutated_gbs_never_reads_past_bounds(data):
    original = build_gbs(bitstream=b"\x5a" * 64, afu_ids=(NLB0_AFU_ID, NLB3_AFU_ID))
    mutated = _mutate(original, data.draw, window=len(original))
    stream = BoundedStream(mutated, budget=20 + gbs_module.MAX_METADATA_BYTES)
    try:
        image = read_gbs(stream, len(mutated))
    except ValueError:
        return
    assert image.bitstream_offset + image.bitstream_length == len(mutated)


@FUZZ
@given(st.data())
def test_fuzz_mutated_xclbin_never_reads_past_bounds(data):
    original = build_xclbin(XclbinSpec(sections=[
        XclbinSection(0, "bit", b"\xa5" * 64), XclbinSection(14, "build", b"{}"),
        XclbinSection(6, "mem", bytes(16))]))
    mutated = _mutate(original, data.draw, window=600)
    stream = BoundedStream(mutated, budget=456 + 40 * MAX_SECTIONS)
    try:
        image = read_xclbin(stream, len(mutated))
    except ValueError:
        return
    assert image.length <= len(mutated)
    for section in image.sections:
        assert section.offset + section.size <= image.length


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=24), inner,
                                                                max_size=4),
    max_leaves=20)


@FUZZ
@given(st.dictionaries(st.sampled_from(["magic-no", "interface-uuid", "accelerator-clusters",
                                        "power", "clock-frequency-high"]), _json),
       _json)
def test_fuzz_metadata_values_only_value_error(afu_fields, version):
    meta = gbs_metadata()
    meta["afu-image"].update(afu_fields)  # type: ignore[union-attr]
    meta["version"] = version
    with contextlib.suppress(ValueError):
        parse_gbs(build_gbs(meta))


# ---------------------------------------------------------------- library


@pytest.fixture
def library(tmp_path: Path) -> ImageLibrary:
    root = tmp_path / "images"
    write_image(root, "intel/nlb0.gbs", build_gbs())
    write_image(root, "alveo/app.xclbin", build_xclbin())
    write_image(tmp_path, "secret.gbs", build_gbs())
    return ImageLibrary(root)


def test_library_reads_images_by_relative_name(library):
    assert library.read_gbs("intel/nlb0.gbs").afu_id == NLB0_HEX
    assert library.read_xclbin("alveo/app.xclbin").platform_vbnv == XCLBIN_SHELL
    assert library.read_gbs("./intel/nlb0.gbs").afu_id == NLB0_HEX
    assert library.max_bytes == DEFAULT_MAX_BYTES == 512 * 1024 * 1024


@pytest.mark.parametrize(("name", "message"), [
    ("", "empty"),
    ("/etc/passwd", "is absolute"),
    ("../secret.gbs", "'..' component"),
    ("intel/../../secret.gbs", "'..' component"),
    ("intel/../intel/nlb0.gbs", "'..' component"),
    ("intel/nlb0.gbs\0x", "NUL byte"),
    ("intel/missing.gbs", "is not in the image library"),
    (".", "outside the image library"),
    ("intel", "not a regular file"),
])
def test_library_refuses_names(library, name, message):
    with pytest.raises(ValueError) as caught:
        library.read_gbs(name)
    assert message in str(caught.value)


def test_library_follows_symlinks_inside_the_root(library):
    root = library.root
    (root / "current.gbs").symlink_to("intel/nlb0.gbs")
    (root / "latest").symlink_to(root / "intel")
    assert library.read_gbs("current.gbs").afu_id == NLB0_HEX
    assert library.read_gbs("latest/nlb0.gbs").afu_id == NLB0_HEX


def test_library_refuses_symlinks_that_escape(library, tmp_path):
    root = library.root
    (root / "escape.gbs").symlink_to(tmp_path / "secret.gbs")
    (root / "relative.gbs").symlink_to("../secret.gbs")
    (root / "outdir").symlink_to(tmp_path)
    (root / "loop").symlink_to("loop")
    for name in ("escape.gbs", "relative.gbs", "outdir/secret.gbs"):
        with pytest.raises(ValueError, match="outside the image library"):
            library.read_gbs(name)
    with pytest.raises(ValueError, match="cannot be resolved: Symlink loop"):
        library.read_gbs("loop")


def test_library_root_behind_a_symlink(tmp_path, library):
    link = tmp_path / "images-link"
    link.symlink_to(library.root)
    assert ImageLibrary(link).read_gbs("intel/nlb0.gbs").afu_id == NLB0_HEX
    with pytest.raises(ValueError, match="unavailable"):
        ImageLibrary(tmp_path / "nowhere").read_gbs("intel/nlb0.gbs")


def test_library_refuses_a_fifo_without_blocking(library):
    os.mkfifo(library.root / "pipe.gbs")
    with pytest.raises(ValueError, match="not a regular file"):
        library.read_gbs("pipe.gbs")


def test_library_size_bound(library):
    small = ImageLibrary(library.root, max_bytes=1000)
    with pytest.raises(ValueError, match=r"is \d+ bytes, over the 1000-byte bound"):
        small.read_gbs("intel/nlb0.gbs")
    assert ImageLibrary(library.root, max_bytes=5000).read_gbs("intel/nlb0.gbs")


def test_library_names_the_image_in_parse_errors(library):
    write_image(library.root, "bad.xclbin", b"xclbin0\0" + bytes(600))
    with pytest.raises(ValueError, match=r"image 'bad.xclbin': not an xclbin2 file"):
        library.read_xclbin("bad.xclbin")
    with pytest.raises(ValueError, match=r"image 'alveo/app.xclbin': not a GBS file"):
        library.read_gbs("alveo/app.xclbin")


def test_library_checks_where_the_descriptor_really_points(library, tmp_path, monkeypatch):
    """A directory swapped for an outside symlink between resolve and open is caught."""
    real_readlink = os.readlink

    def swapped(path):
        if str(path).startswith("/proc/self/fd/"):
            return str(tmp_path / "secret.gbs")
        return real_readlink(path)

    monkeypatch.setattr(os, "readlink", swapped)
    with pytest.raises(ValueError, match="the tree changed while it was opened"):
        library.read_gbs("intel/nlb0.gbs")


def test_library_refuses_escapes_without_proc(library, tmp_path, monkeypatch):
    """Where /proc is absent, the check on the resolved path alone still holds."""
    (library.root / "escape.gbs").symlink_to(tmp_path / "secret.gbs")
    real_readlink = os.readlink

    def no_proc(path):
        if str(path).startswith("/proc/self/fd/"):
            raise FileNotFoundError(path)
        return real_readlink(path)

    monkeypatch.setattr(os, "readlink", no_proc)
    assert library.read_gbs("intel/nlb0.gbs").afu_id == NLB0_HEX
    with pytest.raises(ValueError, match=r"resolves to .*, outside the image library"):
        library.read_gbs("escape.gbs")


def test_library_never_loads_the_bitstream(library):
    path = write_image(library.root, "big.gbs", build_gbs(bitstream=b""))
    with path.open("r+b") as f:
        f.truncate(256 * 1024 * 1024)  # sparse: a 256 MiB image costs no disk
    tracemalloc.start()
    try:
        image = library.read_gbs("big.gbs")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert image.bitstream_length > 255 * 1024 * 1024
    assert peak < 1024 * 1024
