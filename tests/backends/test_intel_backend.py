"""Intel OPAE and DFL ports as the kubelet will see them, on fake sysfs trees."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from conftest import by_id

from compat_tests.fake_sysfs import (
    CRASHED_AFU_ID,
    DEFAULT_AFU_ID,
    DEFAULT_INTERFACE_ID,
    OTHER_AFU_ID,
    FakeNode,
    build_broken_node,
)
from plugin.discovery.backends.intel import AFU_CRASHED, IntelBackend
from value_types.devices import DeviceNode, Health

INTEL_IDS = {
    "0000:5e:00.0", "0000:3b:00.0", "0000:3b:00.0-port1", "0000:be:00.1", "0000:be:00.2",
    "0000:d8:00.0",
}


def scan(node: FakeNode) -> dict:
    return by_id(IntelBackend(node.config()).scan())


def test_every_port_of_both_drivers_is_found_by_pci_address(intel_node: FakeNode) -> None:
    devices = scan(intel_node)
    assert set(devices) == INTEL_IDS
    assert all(d.healthy and d.backend == "intel" for d in devices.values())
    assert devices["0000:5e:00.0"].attribute("driver") == "intel-fpga"
    assert devices["0000:d8:00.0"].attribute("driver") == "dfl"


def test_ports_carry_numa_node_and_discovery_facts(intel_node: FakeNode) -> None:
    devices = scan(intel_node)
    assert {i: d.numa_node for i, d in devices.items()} == {
        "0000:5e:00.0": 0, "0000:3b:00.0": 0, "0000:3b:00.0-port1": 0,
        "0000:be:00.1": 1, "0000:be:00.2": 1, "0000:d8:00.0": 1,
    }
    port = devices["0000:5e:00.0"]
    assert port.attrs == {
        "afu_id": DEFAULT_AFU_ID,
        "interface_id": DEFAULT_INTERFACE_ID,
        "vendor": "0x8086",
        "device": "0x09c4",
        "card": "DSC_1_X",
        "driver": "intel-fpga",
        "port": "intel-fpga-port.0",
        "port_number": "0",
        "pci_address": "0000:5e:00.0",
        "fme_node": "/dev/intel-fpga-fme.0",
    }
    assert devices["0000:d8:00.0"].attribute("afu_id") == OTHER_AFU_ID


def test_each_port_gets_its_own_device_node(intel_node: FakeNode) -> None:
    devices = scan(intel_node)
    assert devices["0000:5e:00.0"].nodes == (
        DeviceNode("/dev/intel-fpga-port.0", "/dev/intel-fpga-port.0", "rw"),)
    assert devices["0000:3b:00.0"].nodes[0].host_path == "/dev/dfl-port.0"
    assert devices["0000:3b:00.0-port1"].nodes[0].host_path == "/dev/dfl-port.1"
    nodes = [n.host_path for d in devices.values() for n in d.nodes]
    assert len(nodes) == len(set(nodes)) == len(INTEL_IDS)


def test_virtual_functions_are_devices_with_the_interface_of_their_parent(
    intel_node: FakeNode,
) -> None:
    devices = scan(intel_node)
    assert "0000:be:00.0" not in devices
    for vf in ("0000:be:00.1", "0000:be:00.2"):
        assert devices[vf].attribute("device") == "0x09c5"
        assert devices[vf].attribute("interface_id") == DEFAULT_INTERFACE_ID


def test_dfl_virtual_functions_too(tmp_path: Path) -> None:
    node = FakeNode(tmp_path)
    node.add_dfl_card("0000:af:00.0", vfs=3, numa_node=1)
    devices = scan(node)
    assert set(devices) == {"0000:af:00.1", "0000:af:00.2", "0000:af:00.3"}
    assert {d.attribute("interface_id") for d in devices.values()} == {DEFAULT_INTERFACE_ID}


@pytest.mark.parametrize(("subsystem", "card"), [
    ("0x1770", "OFS N6000"), ("0x1771", "OFS N6001"), ("0x17d4", "OFS C6100")])
def test_ofs_agilex_cards_and_their_virtual_functions(tmp_path: Path, subsystem: str,
                                                      card: str) -> None:
    """dfl-pci.c binds 0xbcce (PF) and 0xbccf (VF) with these subsystem IDs; with SR-IOV
    the PF keeps only its FME and each VF carries one port of its own."""
    node = FakeNode(tmp_path)
    node.add_dfl_card("0000:b1:00.0", device="0xbcce", vf_device="0xbccf",
                      subsystem_device=subsystem, numa_node=1)
    node.add_dfl_card("0000:ca:00.0", vfs=2, device="0xbcce", vf_device="0xbccf",
                      subsystem_device=subsystem, numa_node=0)
    devices = scan(node)
    assert sorted(devices) == ["0000:b1:00.0", "0000:ca:00.1", "0000:ca:00.2"]
    assert {d.attribute("card") for d in devices.values()} == {card}
    assert devices["0000:b1:00.0"].numa_node == 1
    nodes = sorted(n.host_path for d in devices.values() for n in d.nodes)
    assert nodes == ["/dev/dfl-port.0", "/dev/dfl-port.1", "/dev/dfl-port.2"]
    assert all(d.healthy for d in devices.values())
    assert {d.attribute("interface_id") for d in devices.values()} == {DEFAULT_INTERFACE_ID}
    assert devices["0000:ca:00.1"].attribute("device") == "0xbccf"


def test_a_card_newer_than_the_id_table_is_served_without_a_name(tmp_path: Path) -> None:
    node = FakeNode(tmp_path)
    node.add_dfl_card("0000:b1:00.0", device="0xbcce", subsystem_device="0x9999")
    node.add_dfl_card("0000:c1:00.0", device="0x7777")
    devices = scan(node)
    assert sorted(devices) == ["0000:b1:00.0", "0000:c1:00.0"]
    assert all(d.healthy and not d.attribute("card") for d in devices.values())


def test_second_port_of_a_function_is_named_after_its_port_number(tmp_path: Path) -> None:
    node = FakeNode(tmp_path)
    node.add_dfl_card("0000:3b:00.0", ports=0)
    # The kernel instance numbers run opposite to the hardware port numbers.
    second = node.add_port("0000:3b:00.0", port_id=2)
    first = node.add_port("0000:3b:00.0", port_id=0)
    devices = scan(node)
    assert devices["0000:3b:00.0"].attribute("port") == first
    assert devices["0000:3b:00.0-port2"].attribute("port") == second


def test_ids_do_not_depend_on_listing_order(tmp_path: Path) -> None:
    node = FakeNode(tmp_path)
    node.add_dfl_card("0000:3b:00.0", ports=3)
    first = IntelBackend(node.config()).scan()
    again = IntelBackend(node.config()).scan()
    assert [d.id for d in first] == [d.id for d in again] == [
        "0000:3b:00.0", "0000:3b:00.0-port1", "0000:3b:00.0-port2"]
    assert all(len(d.id) <= 63 for d in first)


def test_two_ports_claiming_one_number_keep_ids_unique(tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """None of them is port 0, so none may take the bare address; the lowest instance keeps
    the ID of port 1 and the others are skipped, each with a warning."""
    node = FakeNode(tmp_path)
    node.add_dfl_card("0000:3b:00.0", ports=0)
    first = node.add_port("0000:3b:00.0", port_id=1)
    second = node.add_port("0000:3b:00.0", port_id=1)
    dup = node.add_port("0000:3b:00.0", port_id=1)
    devices = IntelBackend(node.config()).scan()
    assert [(d.id, d.attribute("port")) for d in devices] == [("0000:3b:00.0-port1", first)]
    assert str(node.port_class_path(second)) in caplog.text
    assert str(node.port_class_path(dup)) in caplog.text


def test_a_port_keeps_its_id_when_port_zero_of_its_function_is_removed(
    tmp_path: Path,
) -> None:
    """An ID is only the port's own: losing a sibling must not rename it, or the kubelet sees
    a remove and an add and a DRA claim on the old name lands on another port."""
    node = FakeNode(tmp_path)
    [zero, one] = node.add_dfl_card("0000:3b:00.0", ports=2)
    backend = IntelBackend(node.config())
    assert [d.id for d in backend.scan()] == ["0000:3b:00.0", "0000:3b:00.0-port1"]
    node.remove_port(zero)
    [device] = backend.scan()
    assert device.id == "0000:3b:00.0-port1"
    assert device.attribute("port") == one
    assert device.nodes[0].host_path == f"/dev/{one}"


def test_a_port_keeps_its_id_when_port_zero_is_released_to_a_virtual_function(
    tmp_path: Path,
) -> None:
    node = FakeNode(tmp_path)
    [zero, one] = node.add_opae_card("0000:5e:00.0", ports=2)
    vf, moved = node.release_port_to_vf(zero)
    devices = scan(node)
    assert sorted(devices) == ["0000:5e:00.0-port1", vf]
    assert devices["0000:5e:00.0-port1"].attribute("port") == one
    assert devices[vf].attribute("port") == moved


def test_a_function_whose_only_port_is_number_one_names_it_so(tmp_path: Path) -> None:
    node = FakeNode(tmp_path)
    node.add_dfl_card("0000:3b:00.0", ports=0)
    node.add_port("0000:3b:00.0", port_id=1)
    assert [d.id for d in IntelBackend(node.config()).scan()] == ["0000:3b:00.0-port1"]


def test_a_virtual_function_port_is_its_function_address_whatever_its_number(
    tmp_path: Path,
) -> None:
    """A VF carries exactly one port (dfl.c: one port per VF), which keeps the hardware
    number it had on the physical function; the VF's own address names it alone."""
    node = FakeNode(tmp_path)
    [_, one] = node.add_dfl_card("0000:3b:00.0", ports=2)
    vf, moved = node.release_port_to_vf(one)
    assert (node.port_path(moved) / "id").read_text().strip() == "1"
    devices = scan(node)
    assert sorted(devices) == ["0000:3b:00.0", vf]
    assert devices[vf].attribute("port") == moved


def test_a_virtual_function_seen_from_a_virtual_machine_is_known_by_its_device_id(
    tmp_path: Path,
) -> None:
    """Passed through to a guest, a VF has no ``physfn`` link (the host keeps the physical
    function) but still has the VF device ID the DFL driver binds."""
    node = FakeNode(tmp_path)
    node.add_dfl_card("0000:00:05.0", ports=0, device="0x0b2c", interface_id=None)
    node.add_port("0000:00:05.0", port_id=1)
    assert [d.id for d in IntelBackend(node.config()).scan()] == ["0000:00:05.0"]


def test_a_port_whose_number_cannot_be_read_is_not_served_under_a_guessed_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """The kernel instance number is no port number: here it would give hardware port 2
    the ID of port 1, and push port 1 itself out."""
    node = FakeNode(tmp_path)
    node.add_dfl_card("0000:3b:00.0", ports=0)
    node.add_port("0000:3b:00.0", port_id=0)  # dfl-port.0
    unreadable = node.add_port("0000:3b:00.0", port_id=2)  # dfl-port.1
    one = node.add_port("0000:3b:00.0", port_id=1)  # dfl-port.2
    (node.port_path(unreadable) / "id").write_text("garbage\n")
    devices = scan(node)
    assert sorted(devices) == ["0000:3b:00.0", "0000:3b:00.0-port1"]
    assert devices["0000:3b:00.0-port1"].attribute("port") == one
    assert str(node.port_class_path(unreadable) / "id") in caplog.text
    (node.port_path(unreadable) / "id").unlink()
    assert sorted(scan(node)) == ["0000:3b:00.0", "0000:3b:00.0-port1"]


@pytest.mark.parametrize("crashed", [CRASHED_AFU_ID, CRASHED_AFU_ID.upper(), "0x" + "f" * 32])
def test_all_f_afu_id_is_unhealthy_until_reprogrammed(intel_node: FakeNode, crashed: str) -> None:
    intel_node.set_afu_id("intel-fpga-port.0", crashed)
    port = scan(intel_node)["0000:5e:00.0"]
    assert port.health is Health.UNHEALTHY
    assert port.health_reason == AFU_CRASHED
    intel_node.set_afu_id("intel-fpga-port.0", OTHER_AFU_ID)
    port = scan(intel_node)["0000:5e:00.0"]
    assert port.healthy and port.health_reason == ""
    assert port.attribute("afu_id") == OTHER_AFU_ID


def test_port_error_register_makes_the_port_unhealthy_until_cleared(
    intel_node: FakeNode,
) -> None:
    backend = IntelBackend(intel_node.config())
    intel_node.set_port_error("dfl-port.2", 0x40)
    port = by_id(backend.scan())["0000:d8:00.0"]
    assert port.health is Health.UNHEALTHY
    assert "0x40" in port.health_reason
    assert str(intel_node.port_class_path("dfl-port.2") / "errors" / "errors") in (
        port.health_reason)
    intel_node.set_port_error("dfl-port.2", 0)
    assert by_id(backend.scan())["0000:d8:00.0"].healthy


def test_missing_device_node_is_unhealthy_until_it_comes_back(intel_node: FakeNode) -> None:
    backend = IntelBackend(intel_node.config())
    intel_node.delete_device_node("intel-fpga-port.1")
    port = by_id(backend.scan())["0000:be:00.1"]
    assert port.health is Health.UNHEALTHY
    assert port.nodes == ()
    assert str(intel_node.dev_root / "intel-fpga-port.1") in port.health_reason
    intel_node.restore_device_node("intel-fpga-port.1")
    port = by_id(backend.scan())["0000:be:00.1"]
    assert port.healthy and port.nodes[0].host_path == "/dev/intel-fpga-port.1"


def test_several_causes_are_all_reported(intel_node: FakeNode) -> None:
    intel_node.set_afu_id("dfl-port.0", CRASHED_AFU_ID)
    intel_node.set_port_error("dfl-port.0", 1)
    intel_node.delete_device_node("dfl-port.0")
    reason = scan(intel_node)["0000:3b:00.0"].health_reason
    assert AFU_CRASHED in reason and "0x1" in reason and "dfl-port.0 " in reason + " "


def test_ports_that_disappear_and_appear_follow_the_tree(intel_node: FakeNode) -> None:
    backend = IntelBackend(intel_node.config())
    intel_node.remove_port("intel-fpga-port.0")
    assert set(by_id(backend.scan())) == INTEL_IDS - {"0000:5e:00.0"}
    intel_node.add_port("0000:5e:00.0")
    assert set(by_id(backend.scan())) == INTEL_IDS
    intel_node.add_opae_card("0000:86:00.0", numa_node=1)
    assert by_id(backend.scan())["0000:86:00.0"].numa_node == 1


def test_node_renamed_by_udev_is_found_through_char_link(intel_node: FakeNode) -> None:
    port = intel_node.ports["intel-fpga-port.0"]
    renamed = intel_node.dev_root / "fpga" / "port0"
    renamed.parent.mkdir()
    (intel_node.dev_root / "intel-fpga-port.0").rename(renamed)
    link = intel_node.dev_root / "char" / port.dev
    link.unlink()
    os.symlink("../fpga/port0", link)
    device = scan(intel_node)["0000:5e:00.0"]
    assert device.healthy
    assert device.nodes == (DeviceNode("/dev/fpga/port0", "/dev/fpga/port0", "rw"),)


def test_char_link_leaving_the_dev_root_is_not_trusted(intel_node: FakeNode,
                                                      tmp_path: Path) -> None:
    port = intel_node.ports["intel-fpga-port.0"]
    outside = tmp_path / "elsewhere"
    outside.write_text("")
    link = intel_node.dev_root / "char" / port.dev
    link.unlink()
    os.symlink(outside, link)
    (intel_node.dev_root / "intel-fpga-port.0").unlink()
    device = scan(intel_node)["0000:5e:00.0"]
    assert device.health is Health.UNHEALTHY
    assert device.nodes == ()


def test_port_without_dev_attribute_still_finds_its_node_by_name(intel_node: FakeNode) -> None:
    (intel_node.port_path("dfl-port.2") / "dev").unlink()
    device = scan(intel_node)["0000:d8:00.0"]
    assert device.healthy and device.nodes[0].host_path == "/dev/dfl-port.2"


def test_dashed_and_upper_case_afu_ids_are_one_spelling(intel_node: FakeNode) -> None:
    intel_node.set_afu_id("dfl-port.2", "D8424DC4-A4A3-C413-F89E-433683F9040B")
    assert scan(intel_node)["0000:d8:00.0"].attribute("afu_id") == DEFAULT_AFU_ID


def test_watch_paths_are_the_existing_class_and_device_directories(
    intel_node: FakeNode,
) -> None:
    paths = IntelBackend(intel_node.config()).watch_paths()
    assert intel_node.dev_root in paths
    assert intel_node.sysfs_root / "class" / "fpga" in paths
    assert intel_node.sysfs_root / "class" / "fpga_region" in paths
    assert all(p.is_dir() for p in paths)


def test_a_node_without_fpga_has_no_ports(tmp_path: Path) -> None:
    backend = IntelBackend(FakeNode(tmp_path).config())
    assert backend.scan() == []
    missing = IntelBackend(FakeNode(tmp_path / "x").config())
    assert missing.scan() == []
    (tmp_path / "x" / "sys").rename(tmp_path / "gone")
    assert missing.scan() == []
    assert missing.watch_paths() == [tmp_path / "x" / "dev", tmp_path / "x" / "dev" / "char"]


def test_broken_node_serves_what_it_can(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    node = build_broken_node(tmp_path)
    with caplog.at_level(logging.WARNING):
        devices = scan(node)
    assert set(devices) == {"0000:12:00.0", "0000:3b:00.0", "0000:5e:00.0", "0000:86:00.0",
                            "0000:af:00.0", "0000:d8:00.0"}
    assert devices["0000:12:00.0"].healthy
    assert devices["0000:3b:00.0"].health_reason == AFU_CRASHED
    assert "reads 0x4" in devices["0000:5e:00.0"].health_reason
    assert "device node" in devices["0000:86:00.0"].health_reason
    assert "not a hex AFU ID" in devices["0000:af:00.0"].health_reason
    assert devices["0000:d8:00.0"].healthy and devices["0000:d8:00.0"].numa_node is None
    fpga = node.sysfs_root / "class" / "fpga"
    region = node.sysfs_root / "class" / "fpga_region"
    for path in (fpga / "intel-fpga-dev.90", fpga / "intel-fpga-dev.91", region / "region90",
                 node.function_path("0000:d8:00.0") / "numa_node",
                 node.cards["0000:12:00.0"].class_link / "dfl-port.x",
                 node.port_class_path("intel-fpga-port.1") / "afu_id"):
        assert str(path) in caplog.text, path
    assert "0000:af:00.0 (intel-fpga-port.1): AFU ID unreadable" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_persisting_problem_is_logged_once_and_again_after_it_cleared(
    intel_node: FakeNode, caplog: pytest.LogCaptureFixture,
) -> None:
    backend = IntelBackend(intel_node.config())
    numa = intel_node.function_path("0000:d8:00.0") / "numa_node"

    def warnings() -> int:
        return sum(str(numa) in r.getMessage() for r in caplog.records
                   if r.levelno == logging.WARNING)

    numa.write_text("???\n")
    for _ in range(3):
        backend.scan()
    assert warnings() == 1
    numa.write_text("1\n")
    backend.scan()
    numa.write_text("???\n")
    backend.scan()
    assert warnings() == 2


def test_a_fifo_where_an_attribute_should_be_does_not_hang_discovery(
    intel_node: FakeNode,
) -> None:
    afu = intel_node.port_path("dfl-port.2") / "afu_id"
    afu.unlink()
    os.mkfifo(afu)
    device = scan(intel_node)["0000:d8:00.0"]
    assert device.health is Health.UNHEALTHY
    assert "not a regular file" in device.health_reason
