"""What discovery reads for programming: an Intel card's FME node, an Alveo card's shell
UUIDs and loaded xclbin. Present, absent and malformed files: a bad value is logged and the
fact left out, the device is served as before, and discovery never raises."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from compat_tests import fake_alveo
from compat_tests.fake_alveo import add_alveo_card, load_xclbin
from compat_tests.fake_sysfs import FakeNode, build_intel_node
from compat_tests.fake_tree import write_file
from plugin.discovery.backends.alveo import AlveoBackend
from plugin.discovery.backends.intel import IntelBackend
from value_types.devices import Device

ALVEO = "0000:17:00.1"
XCLBIN = "8b5a2f60-3d1e-4c0a-9f3b-6a7e2d1c0b94"


def intel(node: FakeNode) -> dict[str, Device]:
    return {d.id: d for d in IntelBackend(node.config()).scan()}


def alveo(node: FakeNode) -> Device:
    [device] = AlveoBackend(node.config()).scan()
    return device


@pytest.fixture
def card(tmp_path: Path) -> FakeNode:
    node = FakeNode(tmp_path)
    add_alveo_card(node, ALVEO)
    return node


# Intel: the FME device node ------------------------------------------------------------------

def test_every_physical_functions_port_names_its_cards_fme_node(tmp_path: Path) -> None:
    devices = intel(build_intel_node(tmp_path))
    assert {i: d.attribute("fme_node") for i, d in devices.items()} == {
        "0000:5e:00.0": "/dev/intel-fpga-fme.0",  # OPAE
        "0000:3b:00.0": "/dev/dfl-fme.0", "0000:3b:00.0-port1": "/dev/dfl-fme.0",  # DFL
        "0000:d8:00.0": "/dev/dfl-fme.1",
        "0000:be:00.1": "", "0000:be:00.2": "",  # virtual functions have no FME
    }


def test_a_missing_fme_node_leaves_the_fact_out_and_the_port_healthy(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    node = build_intel_node(tmp_path)
    node.delete_fme_node("0000:3b:00.0")
    with caplog.at_level(logging.WARNING):
        devices = intel(node)
    port = devices["0000:3b:00.0"]
    assert port.attribute("fme_node") == "" and port.healthy
    assert devices["0000:d8:00.0"].attribute("fme_node") == "/dev/dfl-fme.1"
    assert not caplog.records  # an option, not a fault: nothing to warn about
    node.restore_fme_node("0000:3b:00.0")
    assert intel(node)["0000:3b:00.0"].attribute("fme_node") == "/dev/dfl-fme.0"


def test_a_malformed_fme_dev_is_reported_and_the_node_found_by_name(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    node = build_intel_node(tmp_path)
    fme = node.cards["0000:d8:00.0"].fme
    assert fme is not None
    write_file(fme / "dev", "not-a-number")
    with caplog.at_level(logging.WARNING):
        port = intel(node)["0000:d8:00.0"]
    assert port.attribute("fme_node") == "/dev/dfl-fme.1" and port.healthy
    assert any(f"{fme.name}/dev" in r.getMessage() for r in caplog.records)


def test_a_malformed_fme_dev_without_a_node_leaves_the_fact_out(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    node = build_intel_node(tmp_path)
    node.delete_fme_node("0000:d8:00.0")
    fme = node.cards["0000:d8:00.0"].fme
    assert fme is not None
    write_file(fme / "dev", "\x01\x02")
    with caplog.at_level(logging.WARNING):
        port = intel(node)["0000:d8:00.0"]
    assert port.attribute("fme_node") == "" and port.healthy
    assert any(f"{fme.name}/dev" in r.getMessage() for r in caplog.records)


# Alveo: logic and interface UUIDs, loaded xclbin ---------------------------------------------

def test_the_shells_uuids_are_read_and_no_xclbin_means_none_recorded(card: FakeNode) -> None:
    device = alveo(card)
    assert device.attribute("logic_uuid") == fake_alveo.DEFAULT_LOGIC_UUID
    assert device.attribute("interface_uuid") == fake_alveo.DEFAULT_INTERFACE_UUID
    assert device.attribute("xclbin_uuid") == ""  # all zeros: nothing loaded


def test_the_loaded_xclbins_uuid_is_recorded(card: FakeNode) -> None:
    load_xclbin(card, ALVEO, XCLBIN.upper())
    assert alveo(card).attribute("xclbin_uuid") == XCLBIN


def test_a_dashed_logic_uuid_is_spelt_as_32_hex_digits(card: FakeNode) -> None:
    path = card.function_path(ALVEO)
    write_file(path / "logic_uuids", XCLBIN.upper())
    assert alveo(card).attribute("logic_uuid") == XCLBIN.replace("-", "")


@pytest.mark.parametrize("name", ["logic_uuids", "interface_uuids", "xclbinuuid"])
@pytest.mark.parametrize("state", ["missing", "empty"])
def test_absent_or_empty_files_say_nothing(card: FakeNode, name: str, state: str,
                                           caplog: pytest.LogCaptureFixture) -> None:
    """Older XRT has no such file; a card without a device tree prints nothing."""
    path = card.function_path(ALVEO) / name
    if state == "missing":
        path.unlink()
    else:
        write_file(path, "")
    with caplog.at_level(logging.WARNING):
        device = alveo(card)
    fact = {"logic_uuids": "logic_uuid", "interface_uuids": "interface_uuid",
            "xclbinuuid": "xclbin_uuid"}[name]
    assert device.attribute(fact) == "" and device.healthy
    assert not caplog.records


@pytest.mark.parametrize(("name", "text", "fact"), [
    ("logic_uuids", "zz65b0a3ae8c64f619bc150384ace69b", "logic_uuid"),
    ("logic_uuids", "f465b0a3", "logic_uuid"),  # not 128 bits
    ("interface_uuids", "862c7020a250293e32036f19956669e5\nnot-a-uuid", "interface_uuid"),
    ("xclbinuuid", "8b5a2f603d1e4c0a9f3b6a7e2d1c0b94", "xclbin_uuid"),  # not %pUb
    ("xclbinuuid", "8b5a2f60-3d1e-4c0a-9f3b-6a7e2d1c0b9", "xclbin_uuid"),
])
def test_a_malformed_value_is_logged_and_left_out(card: FakeNode, name: str, text: str,
                                                   fact: str,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    load_xclbin(card, ALVEO, XCLBIN)
    path = card.function_path(ALVEO) / name
    write_file(path, text)
    with caplog.at_level(logging.WARNING):
        device = alveo(card)
    assert device.attribute(fact) == "" and device.healthy
    assert device.attribute("shell") == fake_alveo.DEFAULT_SHELL  # the rest is still read
    assert any(f"{ALVEO}/{path.name}" in r.getMessage() for r in caplog.records)


def test_an_unreadable_file_is_logged_and_left_out(card: FakeNode,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    path = card.function_path(ALVEO) / "logic_uuids"
    path.unlink()
    path.mkdir()  # not a regular file: what a damaged tree can hold
    with caplog.at_level(logging.WARNING):
        device = alveo(card)
    assert device.attribute("logic_uuid") == "" and device.healthy
    assert any(f"{ALVEO}/{path.name}" in r.getMessage() for r in caplog.records)


def test_several_interface_uuids_record_none(card: FakeNode,
                                             caplog: pytest.LogCaptureFixture) -> None:
    """A list cut to its first entry would let a selector match half of what the shell is."""
    write_file(card.function_path(ALVEO) / "interface_uuids",
           f"{fake_alveo.DEFAULT_INTERFACE_UUID}\n{fake_alveo.DEFAULT_LOGIC_UUID}")
    with caplog.at_level(logging.WARNING):
        device = alveo(card)
    assert device.attribute("interface_uuid") == ""
    assert device.attribute("logic_uuid") == fake_alveo.DEFAULT_LOGIC_UUID
    assert not caplog.records
