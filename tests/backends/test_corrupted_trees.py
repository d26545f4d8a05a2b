"""Discovery on trees damaged at random: it never raises, never invents a device, never
gives an ID to another port than the intact tree did, and a device whose files were left
alone is reported exactly as on the intact tree."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from damage import FAST_TMP, ID, apply, captured, damage_lists, touched
from hypothesis import HealthCheck, given, settings

from compat_tests.fake_sysfs import FakeNode, build_intel_node
from plugin.discovery.backends.aws import AwsF1Backend
from plugin.discovery.backends.intel import IntelBackend
from value_types.devices import Device


def build(root: Path) -> FakeNode:
    node = build_intel_node(root)
    node.add_slot("0000:00:0f.0", numa_node=0)
    node.add_slot("0000:00:11.0", numa_node=1)
    return node


def footprints(node: FakeNode) -> dict[str, list[Path]]:
    """For each PCI function, the paths whose damage may change what its devices report."""
    prints: dict[str, list[Path]] = {}
    for port in node.ports.values():
        card = node.cards[port.bdf]
        function = node.function_path(port.bdf)
        paths = [port.path, card.path, card.class_link, function,
                 node.sysfs_root / "bus" / "pci" / "devices" / port.bdf,
                 node.dev_root / port.name, node.dev_root / "char" / port.dev]
        if card.fme is not None:  # its node decides the port's fme_node fact
            paths += [node.dev_root / card.fme.name,
                      node.dev_root / "char" / node.fme_dev(port.bdf)]
        physfn = function / "physfn"
        if physfn.is_symlink():
            parent = physfn.resolve()
            paths += [parent, node.cards[parent.name].path, node.cards[parent.name].class_link]
        prints.setdefault(port.bdf, []).extend(paths)
    devices = node.sysfs_root / "bus" / "pci" / "devices"
    earlier: list[Path] = []
    for app, management in node.slots:
        # Slots are numbered in discovery order: losing an earlier one renumbers this one.
        earlier += [node.function_path(management), devices / management]
        prints[app] = [node.function_path(app), devices / app, *earlier]
    return prints


def scan_all(node: FakeNode) -> list[Device]:
    config = node.config()
    return IntelBackend(config).scan() + AwsF1Backend(config).scan()


def place(device: Device) -> tuple[str, str, str]:
    """Which hardware a device is: its backend, PCI function and (Intel) port."""
    return device.backend, device.attribute("pci_address"), device.attribute("port")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(damage_lists(build))
def test_discovery_survives_any_damage(damages: list[tuple[int, str, bytes]]) -> None:
    with tempfile.TemporaryDirectory(dir=FAST_TMP) as tmp:
        root = Path(tmp)
        node = build(root)
        intact = {d.id: d for d in scan_all(node)}
        by_function = footprints(node)
        prints = {i: by_function[i.split("-port")[0]] for i in intact}
        assert len(intact) == len(node.ports) + len(node.slots)
        damaged = apply(root, damages)

        with captured() as log:
            devices = scan_all(node)

        assert not [r for r in log.records if r.levelno >= logging.ERROR], "discovery raised"
        ids = [d.id for d in devices]
        assert len(ids) == len(set(ids))
        places = {i: place(d) for i, d in intact.items()}
        for device in devices:
            assert place(device) in places.values(), "damage invented a device"
            # The DRA-critical guarantee: an ID never names another port than it did. A
            # damaged port may lose its ID (a VF whose physfn link and device ID are both
            # broken looks like a physical function's port 1), never take a sibling's.
            assert places.get(device.id, place(device)) == place(device), "an ID moved"
        for device in devices:
            assert ID.match(device.id) and len(device.id) <= 63
            assert device.healthy or device.health_reason
        for device_id, footprint in prints.items():
            if not touched(footprint, damaged):
                assert {d.id: d for d in devices}.get(device_id) == intact[device_id], device_id
        for record in log.records:
            if record.levelno == logging.WARNING:
                assert str(root) in record.getMessage(), record.getMessage()
