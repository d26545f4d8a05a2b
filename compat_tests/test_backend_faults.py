"""Every backend end to end: a health fault on the fake tree reaches the kubelet, and the
fault's end too, against the real ``serve`` process (the reliability suite's promise,
:mod:`compat_tests.test_reliability`, for each family of hardware). How soon (the README's
"within a second") is measured by ``bench/hotplug.py``, per backend; a wall-clock bound here
would fail on a busy machine without a fault.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from compat_tests import fake_alveo
from compat_tests.fake_sysfs import (
    AMAZON_VENDOR,
    CRASHED_AFU_ID,
    DEFAULT_AFU_ID,
    F1_CLEARED,
    FakeNode,
)
from compat_tests.test_matrix import ALL_UNITS, RESOURCE, SETTLE, unit_ids

F2_AFI = ("0x10ee", "0xf010")
"""An image with its own vendor: the F2 slot must come back under it, found by its mailbox."""

# -- every backend, end to end -----------------------------------------------------------


def intel_node(root: Path) -> tuple[FakeNode, str, str]:
    node = FakeNode(root)
    [port] = node.add_dfl_card("0000:3b:00.0")
    return node, port, "0000:3b:00.0"


def f1_node(root: Path) -> tuple[FakeNode, str, str]:
    node = FakeNode(root)
    node.add_slot("0000:00:0f.0")
    return node, "", "0000:00:0f.0"


def f2_node(root: Path) -> tuple[FakeNode, str, str]:
    node = FakeNode(root)
    node.add_f2_slot("0000:34:00.0")
    return node, "", "0000:34:00.0"


def crash_afu(node: FakeNode, port: str, _device: str) -> None:
    node.set_afu_id(port, CRASHED_AFU_ID)


def recover_afu(node: FakeNode, port: str, _device: str) -> None:
    node.set_afu_id(port, DEFAULT_AFU_ID)


def latch_error(node: FakeNode, port: str, _device: str) -> None:
    node.set_port_error(port, 0x10)


def clear_error(node: FakeNode, port: str, _device: str) -> None:
    node.set_port_error(port, 0)


def lose_node(node: FakeNode, port: str, _device: str) -> None:
    node.delete_device_node(port)


def restore_node(node: FakeNode, port: str, _device: str) -> None:
    node.restore_device_node(port)


def unload_slot(node: FakeNode, _port: str, device: str) -> None:
    node.remove_application_function(device)


def reload_slot(node: FakeNode, _port: str, device: str) -> None:
    node.add_function(device, AMAZON_VENDOR, F1_CLEARED, 0, pci_class="0x058000")


def alveo_node(root: Path) -> tuple[FakeNode, str, str]:
    node = FakeNode(root)
    fake_alveo.add_alveo_card(node, "0000:17:00.1")
    return node, "", "0000:17:00.1"


def card_not_ready(node: FakeNode, _port: str, device: str) -> None:
    fake_alveo.set_state(node, device, "ready", "0x0")


def card_ready(node: FakeNode, _port: str, device: str) -> None:
    fake_alveo.set_state(node, device, "ready", "0x1")


def trip_firewall(node: FakeNode, _port: str, device: str) -> None:
    fake_alveo.trip_firewall(node, device)


def clear_firewall(node: FakeNode, _port: str, device: str) -> None:
    fake_alveo.trip_firewall(node, device, status="0")


def unbind_xocl(node: FakeNode, _port: str, device: str) -> None:
    fake_alveo.unbind_xocl(node, device)


def bind_xocl(node: FakeNode, _port: str, device: str) -> None:
    fake_alveo.bind_xocl(node, device)


def lose_render_node(node: FakeNode, _port: str, device: str) -> None:
    fake_alveo.delete_render_node(node, device)


def restore_render_node(node: FakeNode, _port: str, device: str) -> None:
    fake_alveo.restore_render_node(node, device)


def load_f2_afi(node: FakeNode, _port: str, device: str) -> None:
    node.load_afi(device, *F2_AFI)


FAULTS = {
    "afu-crash": (intel_node, crash_afu, recover_afu),
    "port-error": (intel_node, latch_error, clear_error),
    "device-node-gone": (intel_node, lose_node, restore_node),
    "f1-image-load": (f1_node, unload_slot, reload_slot),
    "alveo-not-ready": (alveo_node, card_not_ready, card_ready),
    "alveo-firewall-tripped": (alveo_node, trip_firewall, clear_firewall),
    "alveo-xocl-unbound": (alveo_node, unbind_xocl, bind_xocl),
    "alveo-render-node-gone": (alveo_node, lose_render_node, restore_render_node),
    "f2-image-load": (f2_node, unload_slot, load_f2_afi),
}


@pytest.mark.parametrize(
    ("backend", "fault"),
    [("auto", f) for f in FAULTS]
    + [("intel", f) for f in FAULTS if FAULTS[f][0] is intel_node]
    + [("aws", f) for f in FAULTS if FAULTS[f][0] in (f1_node, f2_node)]
    + [("alveo", f) for f in FAULTS if FAULTS[f][0] is alveo_node],
)
async def test_every_backend_reports_health_changes(
        kubelet, plugin, tmp_path, backend, fault):
    build, break_it, mend_it = FAULTS[fault]
    node, port, device = build(tmp_path / "node")
    kubelet_node = await kubelet("1.26")
    daemon = plugin(extra=["--backend", backend, "--sysfs-root", str(node.sysfs_root),
                           "--dev-root", str(node.dev_root)])
    await kubelet_node.wait_for_devices(RESOURCE, lambda d: device in d and d[device].healthy,
                                        timeout=SETTLE)
    for action, healthy in ((break_it, False), (mend_it, True)):
        action(node, port, device)
        await kubelet_node.wait_for_devices(
            RESOURCE, lambda d, h=healthy: device in d and d[device].healthy is h,
            timeout=SETTLE)
    assert daemon.alive


@pytest.mark.parametrize(("backend", "expected"), [("units", ALL_UNITS), ("none", [])])
async def test_static_backends_serve_end_to_end(kubelet, plugin, backend, expected):
    node = await kubelet("1.26")
    daemon = plugin(extra=["--backend", backend])
    await node.wait_for_registrations(1, timeout=SETTLE)
    devices = await node.wait_for_devices(RESOURCE, lambda d: unit_ids(d) == expected,
                                          timeout=SETTLE)
    assert unit_ids(devices) == expected
    if not expected:
        with pytest.raises(Exception) as refused:
            await node.allocate(RESOURCE, ["0"])
        assert getattr(refused.value, "code", None) == grpc.StatusCode.INVALID_ARGUMENT
    assert await daemon.terminate() == 0
