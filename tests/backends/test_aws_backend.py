"""AWS F1 slots as the kubelet will see them, on fake instances."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from conftest import by_id

from compat_tests.fake_sysfs import AMAZON_VENDOR, F1_16XLARGE_SLOTS, FakeNode
from plugin.discovery.backends.aws import AwsF1Backend
from value_types.devices import Health


def scan(node: FakeNode) -> dict:
    return by_id(AwsF1Backend(node.config()).scan())


def test_f1_16xlarge_has_eight_slots_numbered_in_pci_order(f1_node: FakeNode) -> None:
    devices = AwsF1Backend(f1_node.config()).scan()
    assert [d.id for d in devices] == list(F1_16XLARGE_SLOTS)
    assert [d.attribute("slot") for d in devices] == [str(i) for i in range(8)]
    assert [d.numa_node for d in devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert all(d.healthy and d.backend == "aws" for d in devices)
    first = devices[0]
    assert first.attrs == {
        "driver": "aws-f1",
        "platform": "f1",
        "slot": "0",
        "vendor": "0x1d0f",
        "device": "0x1042",
        "pci_address": "0000:00:0f.0",
        "management_address": "0000:00:10.0",
    }


def test_amazon_network_and_disk_functions_are_not_slots(f1_node: FakeNode) -> None:
    devices = scan(f1_node)
    assert "0000:00:03.0" not in devices and "0000:00:04.0" not in devices
    assert not any(d.attribute("device") == "0x1041" for d in devices.values())


def test_application_function_without_management_function_is_not_a_slot(
    tmp_path: Path,
) -> None:
    node = FakeNode(tmp_path)
    node.add_function("0000:00:0f.0", AMAZON_VENDOR, "0x1042", 0)
    assert scan(node) == {}


def test_a_loaded_image_keeps_the_slot(tmp_path: Path) -> None:
    node = FakeNode(tmp_path)
    node.add_slot("0000:00:1b.0", app_device="0xf000", numa_node=1)
    [device] = scan(node).values()
    assert device.id == "0000:00:1b.0" and device.attribute("device") == "0xf000"


def test_slots_that_go_and_come_follow_the_tree(f1_node: FakeNode) -> None:
    backend = AwsF1Backend(f1_node.config())
    f1_node.remove_slot("0000:00:15.0")
    devices = by_id(backend.scan())
    assert "0000:00:15.0" not in devices and len(devices) == 7
    # Discovery order numbering: the slots after the gap move up.
    assert devices["0000:00:17.0"].attribute("slot") == "3"
    f1_node.add_slot("0000:00:15.0")
    assert by_id(backend.scan())["0000:00:17.0"].attribute("slot") == "4"


def test_slot_whose_application_function_is_away_is_unhealthy_not_gone(
    f1_node: FakeNode,
) -> None:
    f1_node.remove_application_function("0000:00:13.0")
    device = scan(f1_node)["0000:00:13.0"]
    assert device.health is Health.UNHEALTHY
    assert "0000:00:13.0" in device.health_reason and "absent" in device.health_reason
    assert device.attribute("slot") == "2"
    assert device.numa_node == 0


def test_driver_character_devices_of_the_slot_are_its_nodes(f1_node: FakeNode) -> None:
    function = f1_node.function_path("0000:00:0f.0")
    for index, name in enumerate(("xdma0_user", "xdma0_h2c_0")):
        (function / "xdma" / name).mkdir(parents=True)
        (function / "xdma" / name / "dev").write_text(f"236:{index}\n")
        (f1_node.dev_root / name).write_text("")
    (function / "power").mkdir()
    (function / "power" / "control").write_text("on\n")
    device = scan(f1_node)["0000:00:0f.0"]
    assert device.healthy
    assert sorted(n.host_path for n in device.nodes) == ["/dev/xdma0_h2c_0", "/dev/xdma0_user"]
    (f1_node.dev_root / "xdma0_user").unlink()
    device = scan(f1_node)["0000:00:0f.0"]
    assert device.health is Health.UNHEALTHY
    assert "xdma0_user" in device.health_reason


def test_non_pci_names_are_skipped_with_a_warning(f1_node: FakeNode,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    stray = f1_node.sysfs_root / "bus" / "pci" / "devices" / "not-a-bdf"
    stray.mkdir()
    with caplog.at_level(logging.WARNING):
        devices = scan(f1_node)
    assert len(devices) == 8
    assert str(stray) in caplog.text


def test_watch_paths_include_the_pci_device_list(f1_node: FakeNode) -> None:
    paths = AwsF1Backend(f1_node.config()).watch_paths()
    assert f1_node.sysfs_root / "bus" / "pci" / "devices" in paths


def test_no_slots_without_pci_tree(tmp_path: Path) -> None:
    node = FakeNode(tmp_path)
    (node.sysfs_root / "bus").rename(tmp_path / "bus")
    assert scan(node) == {}
