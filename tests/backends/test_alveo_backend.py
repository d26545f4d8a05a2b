"""Alveo cards under XRT: what is advertised, with which nodes, and when a card is Unhealthy."""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

import pytest
from damage import FAST_TMP, apply, captured, damage_lists
from hypothesis import HealthCheck, given, settings

from compat_tests import fake_alveo
from compat_tests.fake_alveo import ALVEO_CARDS, add_alveo_card, build_alveo_node
from compat_tests.fake_sysfs import FakeNode
from compat_tests.fake_tree import relative_link, write_file
from plugin.discovery.backends import make_backend
from plugin.discovery.backends.alveo import AlveoBackend
from plugin.model.resource_names import resource_name_problem
from plugin.model.resources import group_by_resource, shell_resource_name
from value_types.devices import DeviceSet


def scan(node: FakeNode) -> dict:
    return {d.id: d for d in AlveoBackend(node.config()).scan()}


@pytest.fixture
def node(tmp_path: Path) -> FakeNode:
    return build_alveo_node(tmp_path / "node")


def test_eight_cards_are_their_user_functions_with_render_nodes_and_shells(
    node: FakeNode,
) -> None:
    devices = scan(node)
    assert sorted(devices) == sorted(ALVEO_CARDS)
    first = devices["0000:17:00.1"]
    assert first.healthy and first.numa_node == 0
    assert [n.host_path for n in first.nodes] == ["/dev/dri/renderD128"]
    assert [n.container_path for n in first.nodes] == ["/dev/dri/renderD128"]
    assert first.attrs["shell"] == fake_alveo.DEFAULT_SHELL
    assert first.attrs["shell_timestamp"] == fake_alveo.DEFAULT_TIMESTAMP
    assert first.attrs["management_address"] == "0000:17:00.0"
    assert first.attrs["driver"] == "xocl"
    assert devices["0000:87:00.1"].numa_node == 1
    assert not any(d.endswith(".0") for d in devices), "management functions never advertised"


@pytest.mark.parametrize("vendor", ["0x10ee", "0x13fe", "0x3475"])
def test_the_vendors_xrt_and_xilinx_plugin_accept(tmp_path: Path, vendor: str) -> None:
    node = FakeNode(tmp_path)
    add_alveo_card(node, "0000:17:00.1", vendor=vendor)
    assert list(scan(node)) == ["0000:17:00.1"]


def test_other_vendors_and_amazon_slots_are_not_alveo_cards(tmp_path: Path) -> None:
    node = FakeNode(tmp_path)
    add_alveo_card(node, "0000:17:00.1", vendor="0x8086")
    node.add_slot("0000:00:0f.0")  # xocl may drive it, but it is the aws backend's slot
    write_file(node.function_path("0000:00:0f.0") / "user_pf", "")
    assert scan(node) == {}


def test_markers_decide_not_function_numbers(tmp_path: Path) -> None:
    """Shells before 2018.3 put the user function at 0 and management at 1."""
    node = FakeNode(tmp_path)
    user = node.add_function("0000:65:00.0", "0x10ee", "0x5001", 0)
    management = node.add_function("0000:65:00.1", "0x10ee", "0x5000", 0)
    write_file(user / "user_pf", "")
    write_file(management / "mgmt_pf", "")
    write_file(user / "drm" / "renderD128" / "dev", "226:128")
    write_file(node.dev_root / "dri" / "renderD128", "")
    relative_link(node.dev_root / "char" / "226:128", node.dev_root / "dri" / "renderD128")
    devices = scan(node)
    assert list(devices) == ["0000:65:00.0"] and devices["0000:65:00.0"].healthy
    assert devices["0000:65:00.0"].attrs["management_address"] == "0000:65:00.1"


def test_a_card_with_neither_driver_is_not_advertised(tmp_path: Path) -> None:
    node = FakeNode(tmp_path)
    node.add_function("0000:17:00.0", "0x10ee", "0x5004", 0)
    node.add_function("0000:17:00.1", "0x10ee", "0x5005", 0)
    assert scan(node) == {}


def test_render_node_found_by_name_without_char_links(node: FakeNode) -> None:
    shutil.rmtree(node.dev_root / "char")
    device = scan(node)["0000:17:00.1"]
    assert device.healthy and device.nodes[0].host_path == "/dev/dri/renderD128"


FAULTS = {
    "not ready": (lambda n, b: fake_alveo.set_state(n, b, "ready", "0x0"), "card not ready"),
    "offline": (lambda n, b: fake_alveo.set_state(n, b, "dev_offline", "1"), "card offline"),
    "offline query failed": (lambda n, b: fake_alveo.set_state(n, b, "dev_offline", "-19"),
                             "card offline"),
    "bad state": (lambda n, b: fake_alveo.set_state(n, b, "device_bad_state", "1"),
                  "bad state"),
    "firewall": (lambda n, b: fake_alveo.trip_firewall(n, b), "firewall tripped"),
    "garbage ready": (lambda n, b: fake_alveo.set_state(n, b, "ready", "maybe"),
                      "readiness unknown"),
    "render node gone": (fake_alveo.delete_render_node, "renderD128"),
    "xocl unbound": (fake_alveo.unbind_xocl, "xocl driver not bound"),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_each_sign_of_trouble_makes_only_that_card_unhealthy(node: FakeNode, fault: str) -> None:
    damage, words = FAULTS[fault]
    damage(node, "0000:17:00.1")
    devices = scan(node)
    assert not devices["0000:17:00.1"].healthy
    assert words in devices["0000:17:00.1"].health_reason
    assert str(node.sysfs_root) in devices["0000:17:00.1"].health_reason or \
        str(node.dev_root) in devices["0000:17:00.1"].health_reason
    assert all(d.healthy for i, d in devices.items() if i != "0000:17:00.1")


def test_a_card_recovers_when_the_cause_clears(node: FakeNode) -> None:
    fake_alveo.trip_firewall(node, "0000:17:00.1")
    fake_alveo.unbind_xocl(node, "0000:27:00.1")
    assert not scan(node)["0000:17:00.1"].healthy
    fake_alveo.trip_firewall(node, "0000:17:00.1", status="0")
    fake_alveo.bind_xocl(node, "0000:27:00.1")
    assert all(d.healthy for d in scan(node).values())


def test_state_files_are_health_files_and_dri_is_watched(node: FakeNode) -> None:
    backend = AlveoBackend(node.config())
    backend.scan()
    names = {(p.parent.name if p.name == "status" else "", p.name) for p in backend.health_files()}
    assert ("", "ready") in names and ("", "dev_offline") in names
    assert ("", "device_bad_state") in names
    assert any(parent.startswith("firewall.") for parent, _ in names)
    assert len(backend.health_files()) == 8 * 4
    assert node.dev_root / "dri" in backend.watch_paths()


def test_auto_serves_intel_aws_and_alveo_together(tmp_path: Path) -> None:
    node = FakeNode(tmp_path)
    node.add_dfl_card("0000:3b:00.0")
    node.add_slot("0000:00:0f.0")
    add_alveo_card(node, "0000:17:00.1")
    ids = sorted(d.id for d in make_backend("auto", node.config()).scan())
    assert ids == ["0000:00:0f.0", "0000:17:00.1", "0000:3b:00.0"]


def test_afu_mode_names_a_resource_per_shell_build(tmp_path: Path) -> None:
    node = FakeNode(tmp_path)
    add_alveo_card(node, "0000:17:00.1")
    add_alveo_card(node, "0000:27:00.1")
    add_alveo_card(node, "0000:37:00.1", shell="xilinx_u55c_gen3x16_xdma_base_3",
                   timestamp="1654023155")
    groups = group_by_resource(DeviceSet.of(scan(node).values()), "afu", "unused", "amd.com")
    assert {name: d.ids for name, d in groups.items()} == {
        "amd.com/xilinx_u250_gen3x16_xdma_shell_4_1-1605029394": ("0000:17:00.1", "0000:27:00.1"),
        "amd.com/xilinx_u55c_gen3x16_xdma_base_3-1654023155": ("0000:37:00.1",),
    }


@pytest.mark.parametrize("shell", ["x" * 200, "spaces and / slashes!", "-_.", "é" * 10])
def test_shell_resource_names_are_always_valid_and_distinct(shell: str) -> None:
    name = shell_resource_name("amd.com", shell, "1605029394")
    assert resource_name_problem(name) is None
    assert name != shell_resource_name("amd.com", shell + "2", "1605029394")


def build(root: Path) -> FakeNode:
    node = FakeNode(root)
    for index, bdf in enumerate(ALVEO_CARDS[:3]):
        add_alveo_card(node, bdf, numa_node=index % 2)
    return node


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(damage_lists(build))
def test_discovery_survives_any_damage(damages: list[tuple[int, str, bytes]]) -> None:
    with tempfile.TemporaryDirectory(dir=FAST_TMP) as tmp:
        node = build(Path(tmp))
        intact = scan(node)
        apply(Path(tmp), damages)
        with captured() as log:
            devices = AlveoBackend(node.config()).scan()
        assert not [r for r in log.records if r.levelno >= logging.ERROR], "discovery raised"
        ids = [d.id for d in devices]
        assert len(ids) == len(set(ids)) and set(ids) <= set(intact), "invented a device"
        for device in devices:
            assert device.healthy or device.health_reason
            assert all(n.host_path.startswith("/dev/") for n in device.nodes)
