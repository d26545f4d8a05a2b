"""PCI addresses become device IDs: one canonical spelling, hex everywhere."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from plugin.discovery.backends.pci import PciAddress, canonical_bdf, parse_bdf


def test_canonical_form_is_full_lowercase_hex() -> None:
    assert canonical_bdf("0000:5e:00.0") == "0000:5e:00.0"
    assert canonical_bdf("0000:5E:00.1") == "0000:5e:00.1"
    assert canonical_bdf("5e:00.0") == "0000:5e:00.0"
    assert canonical_bdf(" 0000:af:1f.7\n") == "0000:af:1f.7"


def test_fields_are_hex_not_decimal() -> None:
    address = parse_bdf("0000:10:1a.0")
    assert address == PciAddress(0, 0x10, 0x1A, 0)


def test_wide_domains_keep_all_their_digits() -> None:
    assert canonical_bdf("10000:e1:00.0") == "10000:e1:00.0"


def test_non_addresses_are_refused() -> None:
    for text in ("", "region0", "intel-fpga-dev.0", "0000:5e:00", "0000:5e:20.0",
                 "0000:5e:00.8", "0000:5g:00.0", "0000:5e:00.0.1", "pci0000:5e"):
        assert parse_bdf(text) is None, text


def test_addresses_sort_in_bus_order() -> None:
    texts = ["0000:5e:00.1", "0000:0a:00.0", "0001:00:00.0", "0000:5e:00.0"]
    ordered = sorted(parse_bdf(t) for t in texts)  # type: ignore[type-var]
    assert [str(a) for a in ordered] == [
        "0000:0a:00.0", "0000:5e:00.0", "0000:5e:00.1", "0001:00:00.0"]


addresses = st.builds(PciAddress, st.integers(0, 0xFFFF), st.integers(0, 0xFF),
                      st.integers(0, 0x1F), st.integers(0, 7))


@given(addresses)
def test_canonical_text_round_trips(address: PciAddress) -> None:
    assert parse_bdf(str(address)) == address
    assert parse_bdf(str(address).upper()) == address
    assert len(str(address)) == 12


@given(st.text(max_size=30))
def test_parsing_never_raises(text: str) -> None:
    result = parse_bdf(text)
    assert result is None or canonical_bdf(str(result)) == str(result)
