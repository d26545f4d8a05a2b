"""AWS F2 slots (and F2 next to F1) as the kubelet will see them, on fake instances.

The rules under test come from aws-fpga's SDK (branch f2): slots are found by their mailbox
function only, paired with function 0 of the same device, and numbered with F1 ones in
management-address order, at most eight.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import pytest
from conftest import by_id
from damage import FAST_TMP, ID, apply, captured, damage_lists, touched
from hypothesis import HealthCheck, given, settings

from compat_tests.fake_sysfs import (
    AMAZON_VENDOR,
    F2_48XLARGE_SLOTS,
    F2_CLEARED,
    F2_MANAGEMENT,
    FakeNode,
    build_f2_48xlarge,
)
from plugin.discovery.backends.aws import AwsBackend, AwsF1Backend
from value_types.devices import Device, Health

XILINX = "0x10ee"


@pytest.fixture
def f2_node(tmp_path: Path) -> FakeNode:
    return build_f2_48xlarge(tmp_path)


def scan(node: FakeNode) -> dict[str, Device]:
    return by_id(AwsBackend(node.config()).scan())


def listed(node: FakeNode, bdf: str) -> Path:
    """A function as discovery reaches it (and names it in messages): via ``bus/pci/devices``."""
    return node.sysfs_root / "bus" / "pci" / "devices" / bdf


def add_render_node(node: FakeNode, app_bdf: str, minor: int = 128) -> str:
    """What XRT's xocl registers under the application function it binds: ``drm/renderD*``."""
    name = f"renderD{minor}"
    directory = node.function_path(app_bdf) / "drm" / name
    directory.mkdir(parents=True)
    (directory / "dev").write_text(f"226:{minor}\n")
    (node.dev_root / "dri").mkdir(exist_ok=True)
    (node.dev_root / "dri" / name).write_text("")
    os.symlink(f"../dri/{name}", node.dev_root / "char" / f"226:{minor}")
    return name


def test_f2_48xlarge_has_eight_slots_numbered_by_management_address(f2_node: FakeNode) -> None:
    devices = AwsBackend(f2_node.config()).scan()
    assert [d.id for d in devices] == list(F2_48XLARGE_SLOTS)
    assert [d.attribute("slot") for d in devices] == [str(i) for i in range(8)]
    assert [d.numa_node for d in devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert all(d.healthy and d.backend == "aws" and not d.nodes for d in devices)
    assert devices[0].attrs == {
        "driver": "aws-f2",
        "platform": "f2",
        "slot": "0",
        "vendor": AMAZON_VENDOR,
        "device": F2_CLEARED,
        "pci_address": "0000:34:00.0",
        "management_address": "0000:34:00.1",
    }
    assert AwsF1Backend is AwsBackend


def test_amazon_network_disk_and_lone_application_functions_are_not_slots(
    tmp_path: Path,
) -> None:
    node = FakeNode(tmp_path)
    node.add_function("0000:00:03.0", AMAZON_VENDOR, "0xec20", 0, pci_class="0x020000")
    node.add_function("0000:34:00.0", AMAZON_VENDOR, F2_CLEARED, 0)
    node.add_function("0000:35:00.0", XILINX, "0xf010", 0)
    assert scan(node) == {}


def test_a_management_function_at_another_function_number_still_pairs_with_function_0(
    tmp_path: Path,
) -> None:
    node = FakeNode(tmp_path)
    node.add_f2_slot("0000:34:00.0", mgmt_function=3)
    [device] = scan(node).values()
    assert device.id == "0000:34:00.0" and device.attribute("management_address") == (
        "0000:34:00.3")


def test_an_afi_with_its_own_vendor_keeps_the_slot(f2_node: FakeNode) -> None:
    f2_node.load_afi("0000:36:00.0", XILINX, "0xf010", subsystem_vendor=AMAZON_VENDOR,
                     subsystem_device="0x0103")
    devices = scan(f2_node)
    assert len(devices) == 8
    device = devices["0000:36:00.0"]
    assert device.healthy and device.attribute("slot") == "2"
    assert (device.attribute("vendor"), device.attribute("device")) == (XILINX, "0xf010")
    assert device.attribute("subsystem_vendor") == AMAZON_VENDOR
    assert device.attribute("subsystem_device") == "0x0103"


def test_slot_whose_application_function_is_away_is_unhealthy_not_gone(
    f2_node: FakeNode,
) -> None:
    backend = AwsBackend(f2_node.config())
    (f2_node.function_path("0000:b5:00.0") / "numa_node").write_text("0\n")
    assert by_id(backend.scan())["0000:b5:00.0"].numa_node == 0  # the application's own
    f2_node.remove_application_function("0000:b5:00.0")
    device = by_id(backend.scan())["0000:b5:00.0"]
    assert device.health is Health.UNHEALTHY
    assert "0000:b5:00.0" in device.health_reason and "absent" in device.health_reason
    assert device.attribute("slot") == "5" and device.attribute("platform") == "f2"
    assert device.numa_node == 1  # the management function's, while the application is away
    f2_node.load_afi("0000:b5:00.0", XILINX, "0xf010")
    device = by_id(backend.scan())["0000:b5:00.0"]
    assert device.healthy and device.attribute("vendor") == XILINX and device.numa_node == 1


def test_missing_bar0_makes_the_slot_unhealthy_naming_the_file(tmp_path: Path) -> None:
    node = FakeNode(tmp_path)
    node.add_f2_slot("0000:34:00.0", bar=False)
    node.add_f2_slot("0000:35:00.0")
    devices = scan(node)
    bar0 = listed(node, "0000:34:00.0") / "resource0"
    assert devices["0000:34:00.0"].health is Health.UNHEALTHY
    assert str(bar0) in devices["0000:34:00.0"].health_reason
    assert devices["0000:35:00.0"].healthy
    bar0.write_text("")
    assert scan(node)["0000:34:00.0"].healthy


def test_f1_and_f2_slots_on_one_node_are_numbered_together(tmp_path: Path) -> None:
    node = FakeNode(tmp_path)
    node.add_f2_slot("0000:34:00.0", numa_node=1)
    node.add_slot("0000:00:0f.0")
    node.add_f2_slot("0000:00:05.0")
    node.add_slot("0000:00:11.0")
    devices = AwsBackend(node.config()).scan()
    assert [(d.id, d.attribute("slot"), d.attribute("platform"), d.attribute("driver"))
            for d in devices] == [
        ("0000:00:05.0", "0", "f2", "aws-f2"),
        ("0000:00:0f.0", "1", "f1", "aws-f1"),
        ("0000:00:11.0", "2", "f1", "aws-f1"),
        ("0000:34:00.0", "3", "f2", "aws-f2"),
    ]
    assert all(d.healthy for d in devices)


def test_a_ninth_management_function_is_ignored_with_one_warning(
    f2_node: FakeNode, caplog: pytest.LogCaptureFixture,
) -> None:
    backend = AwsBackend(f2_node.config())
    f2_node.add_f2_slot("0000:b8:00.0", numa_node=1)
    with caplog.at_level(logging.WARNING):
        devices = by_id(backend.scan())
        backend.scan()
    assert list(devices) == list(F2_48XLARGE_SLOTS)
    warned = [r.getMessage() for r in caplog.records if "0000:b8:00.1" in r.getMessage()]
    assert len(warned) == 1 and "FPGA_SLOT_MAX" in warned[0], warned
    # As in the SDK, the eight lowest management addresses win, wherever the ninth sits.
    f2_node.add_f2_slot("0000:30:00.0")
    devices = by_id(backend.scan())
    assert "0000:30:00.0" in devices and devices["0000:30:00.0"].attribute("slot") == "0"
    assert "0000:b7:00.0" not in devices and "0000:b8:00.0" not in devices


def test_a_management_function_at_function_0_is_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    node = FakeNode(tmp_path)
    node.add_function("0000:30:00.0", AMAZON_VENDOR, F2_MANAGEMENT, 0)
    node.add_f2_slot("0000:34:00.0")
    with caplog.at_level(logging.WARNING):
        devices = scan(node)
    # The SDK counts every mailbox function, so the stray one still takes slot number 0.
    assert list(devices) == ["0000:34:00.0"] and devices["0000:34:00.0"].attribute("slot") == "1"
    assert str(listed(node, "0000:30:00.0")) in caplog.text


def test_two_management_functions_on_one_device_give_one_slot(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    node = FakeNode(tmp_path)
    node.add_f2_slot("0000:34:00.0")
    node.add_function("0000:34:00.2", AMAZON_VENDOR, F2_MANAGEMENT, 0)
    with caplog.at_level(logging.WARNING):
        devices = AwsBackend(node.config()).scan()
    assert [d.id for d in devices] == ["0000:34:00.0"]
    assert "already slot 0's" in caplog.text


def test_nodes_of_whatever_driver_binds_the_application_function(f2_node: FakeNode) -> None:
    name = add_render_node(f2_node, "0000:34:00.0")
    device = scan(f2_node)["0000:34:00.0"]
    assert device.healthy and [n.host_path for n in device.nodes] == [f"/dev/dri/{name}"]
    (f2_node.dev_root / "dri" / name).unlink()
    device = scan(f2_node)["0000:34:00.0"]
    assert device.health is Health.UNHEALTHY and name in device.health_reason


def test_garbage_subsystem_ids_cost_the_attribute_only(
    f2_node: FakeNode, caplog: pytest.LogCaptureFixture,
) -> None:
    bad = listed(f2_node, "0000:34:00.0") / "subsystem_vendor"
    bad.write_text("banana\n")
    (bad.parent / "subsystem_device").write_text("0x0103\n")
    with caplog.at_level(logging.WARNING):
        device = scan(f2_node)["0000:34:00.0"]
    assert device.healthy and "subsystem_vendor" not in device.attrs
    assert device.attribute("subsystem_device") == "0x0103"
    assert str(bad) in caplog.text


def test_no_health_files_and_the_pci_list_is_watched(f2_node: FakeNode) -> None:
    backend = AwsBackend(f2_node.config())
    assert backend.health_files() == []
    assert f2_node.sysfs_root / "bus" / "pci" / "devices" in backend.watch_paths()


# -- random damage ---------------------------------------------------------------------------


def build_damageable(root: Path) -> FakeNode:
    """Three F2 slots (one with a foreign AFI and a render node, one with its mailbox at
    function 2) and an F1 slot, among Amazon's network and disk functions."""
    node = FakeNode(root)
    node.add_function("0000:00:03.0", AMAZON_VENDOR, "0xec20", 0, pci_class="0x020000")
    node.add_function("0000:00:04.0", AMAZON_VENDOR, "0x8061", 0, pci_class="0x010802")
    node.add_f2_slot("0000:00:05.0", subsystem_vendor=AMAZON_VENDOR, subsystem_device="0x0000")
    node.add_slot("0000:00:0f.0", numa_node=0)
    node.add_f2_slot("0000:34:00.0", mgmt_function=2)
    node.add_f2_slot("0000:b4:00.0", numa_node=1)
    node.load_afi("0000:b4:00.0", XILINX, "0xf010")
    add_render_node(node, "0000:b4:00.0")
    return node


def slot_footprints(node: FakeNode) -> dict[str, list[Path]]:
    """For each slot, the paths whose damage may change what it reports: its application
    function, its nodes, and every management function up to its own (numbering)."""
    devices = node.sysfs_root / "bus" / "pci" / "devices"
    nodes = [node.dev_root / "dri", node.dev_root / "char" / "226:128"]
    managers = sorted(node.slots, key=lambda pair: pair[1])
    prints: dict[str, list[Path]] = {}
    for app, _ in managers:
        upto = [m for _, m in managers if m <= dict(node.slots)[app]]
        prints[app] = [node.function_path(app), devices / app, *nodes,
                       *(node.function_path(m) for m in upto), *(devices / m for m in upto)]
    return prints


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(damage_lists(build_damageable))
def test_f2_discovery_survives_any_damage(damages: list[tuple[int, str, bytes]]) -> None:
    with tempfile.TemporaryDirectory(dir=FAST_TMP) as tmp:
        root = Path(tmp)
        node = build_damageable(root)
        intact = scan(node)
        assert len(intact) == len(node.slots) and all(d.healthy for d in intact.values())
        prints = slot_footprints(node)
        damaged = apply(root, damages)

        with captured() as log:
            devices = AwsBackend(node.config()).scan()

        assert not [r for r in log.records if r.levelno >= logging.ERROR], "discovery raised"
        ids = [d.id for d in devices]
        assert len(ids) == len(set(ids))
        assert set(ids) <= set(intact), "damage invented a device"
        for device in devices:
            assert ID.match(device.id)
            assert device.healthy or device.health_reason
        for device_id, footprint in prints.items():
            if not touched(footprint, damaged):
                assert by_id(devices).get(device_id) == intact[device_id], device_id
        for record in log.records:
            if record.levelno == logging.WARNING:
                assert str(root) in record.getMessage(), record.getMessage()
