"""How many users an image says its function serves: a GBS's ``total-contexts`` and an
xclbin's compute units (``IP_LAYOUT`` entries of type ``IP_KERNEL``), malformed input refused."""

from __future__ import annotations

import io
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compat_tests.fpga_images import (
    IP_KERNEL,
    NLB0_AFU_ID,
    NLB3_AFU_ID,
    XclbinSection,
    XclbinSpec,
    build_gbs,
    build_xclbin,
    gbs_metadata,
    ip_layout,
    with_compute_units,
)
from plugin.programming.gbs import parse_gbs
from plugin.programming.xclbin import MAX_IP_ENTRIES, parse_xclbin, read_xclbin


class CountingStream(io.BytesIO):
    """Counts the bytes a reader asks for, and refuses reads past the end."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.total = 0

    def read(self, n: int | None = -1) -> bytes:
        assert n is not None and n >= 0 and self.tell() + n <= len(self.getvalue())
        self.total += n
        return super().read(n)


def test_gbs_keeps_each_clusters_contexts_and_the_first_is_the_ports() -> None:
    image = parse_gbs(build_gbs(afu_ids=(NLB0_AFU_ID, NLB3_AFU_ID), contexts=(4, 9)))
    assert image.contexts == (4, 9)
    assert image.total_contexts == 4
    assert parse_gbs(build_gbs()).total_contexts == 1


@pytest.mark.parametrize("contexts", ["4", 4.0, None, True])
def test_gbs_without_an_integer_total_contexts_is_refused(contexts: object) -> None:
    meta = gbs_metadata(contexts=8)
    cluster = meta["afu-image"]["accelerator-clusters"][0]  # type: ignore[index]
    if contexts is None:
        del cluster["total-contexts"]
    else:
        cluster["total-contexts"] = contexts
    with pytest.raises(ValueError, match="total-contexts"):
        parse_gbs(build_gbs(meta))


@pytest.mark.parametrize("kernels", [0, 1, 3, 300])
def test_xclbin_compute_units_are_its_ip_kernel_entries(kernels: int) -> None:
    image = parse_xclbin(build_xclbin(with_compute_units(kernels)))
    assert image.compute_units == kernels


def test_an_xclbin_without_ip_layout_has_no_count() -> None:
    assert parse_xclbin(build_xclbin()).compute_units is None


def test_only_the_ip_layout_is_read_of_the_sections_data() -> None:
    spec = with_compute_units(2, XclbinSpec(sections=[XclbinSection(0, "bit", b"\1" * 100_000)]))
    data = build_xclbin(spec)
    stream = CountingStream(data)
    image = read_xclbin(stream, len(data))
    assert image.compute_units == 2
    assert stream.total == 456 + 2 * 40 + 8 + 4 * 80  # header, table, count, 4 IPs


def _layout_data(entries: list[int], count: int | None = None) -> bytes:
    return ip_layout(0, entries, count=count).data


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"\1\0", "too short for its count"),
        (struct.pack("<i", -1) + bytes(4), "declares -1 IPs"),
        (struct.pack("<i", MAX_IP_ENTRIES + 1) + bytes(4), "over the bound"),
        (struct.pack("<i", 2**31 - 1) + bytes(4), "over the bound"),
        (_layout_data([IP_KERNEL, IP_KERNEL], count=3), "declares 3 IPs (248 bytes), more "
         "than its 168 bytes hold"),
        (struct.pack("<i", 1) + bytes(2), "declares 1 IPs"),
    ],
)
def test_a_malformed_ip_layout_is_a_clear_error(data: bytes, words: str) -> None:
    spec = XclbinSpec(sections=[XclbinSection(0, "bit", b"\xa5" * 64),
                                XclbinSection(8, "ip_layout", data)])
    with pytest.raises(ValueError, match="IP_LAYOUT") as caught:
        parse_xclbin(build_xclbin(spec))
    assert words in str(caught.value)


def test_a_huge_count_allocates_nothing_for_it() -> None:
    """A count the section cannot hold is refused before anything is read for it."""
    spec = XclbinSpec(sections=[XclbinSection(8, "ip_layout",
                                              struct.pack("<i", MAX_IP_ENTRIES) + bytes(4))])
    data = build_xclbin(spec)
    stream = CountingStream(data)
    with pytest.raises(ValueError, match="more than its 8 bytes hold"):
        read_xclbin(stream, len(data))
    assert stream.total == 456 + 40 + 8


def test_the_first_ip_layout_counts_as_xrt_takes_it() -> None:
    spec = XclbinSpec(sections=[ip_layout(2), ip_layout(5)])
    assert parse_xclbin(build_xclbin(spec)).compute_units == 2


def test_a_layout_whose_entries_run_past_the_file_is_refused() -> None:
    data = build_xclbin(with_compute_units(4))
    with pytest.raises(ValueError):
        parse_xclbin(data[:-10])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fuzz_mutated_ip_layout_only_value_error(data: st.DataObject) -> None:
    original = bytearray(build_xclbin(with_compute_units(3, XclbinSpec(sections=[]))))
    layout_at = 456 + 40
    for _ in range(data.draw(st.integers(1, 6))):
        position = data.draw(st.integers(layout_at, len(original) - 1))
        original[position] = data.draw(st.integers(0, 255))
    stream = CountingStream(bytes(original))
    try:
        image = read_xclbin(stream, len(original))
    except ValueError:
        return
    assert image.compute_units is not None and 0 <= image.compute_units <= 5
