"""Discovery on trees damaged at random: it never raises, never invents a device, and a
device whose files were left alone is reported exactly as on the intact tree."""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plugin.backends.aws import AwsF1Backend
from plugin.backends.fake_sysfs import FakeNode, build_intel_node
from plugin.backends.intel import IntelBackend
from plugin.model import Device

ID = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7](-port\d+)?$")
KINDS = ("garbage", "empty", "huge", "binary", "delete", "to_dir", "to_file", "dangling",
         "self_loop", "fifo", "rename")


def build(root: Path) -> FakeNode:
    node = build_intel_node(root)
    node.add_slot("0000:00:0f.0", numa_node=0)
    node.add_slot("0000:00:11.0", numa_node=1)
    return node


def entries(root: Path) -> list[Path]:
    found = []
    for directory, dirs, files in os.walk(root):
        found += [Path(directory) / n for n in sorted(dirs) + sorted(files)]
    return sorted(found)


def corrupt(path: Path, kind: str, salt: bytes) -> None:
    if not os.path.lexists(path):
        return
    if kind == "rename":
        target = path.with_name("garbage-" + salt.hex()[:6])
        while os.path.lexists(target):  # two renames with the same salt in one directory
            target = target.with_name(target.name + "x")
        path.rename(target)
        return
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()
    if kind == "garbage":
        path.write_bytes(b"zz" + salt + b"\n")
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "huge":
        path.write_bytes(b"0" * 9000)
    elif kind == "binary":
        path.write_bytes(b"\xff\xfe\x00" + salt)
    elif kind == "to_dir":
        path.mkdir()
    elif kind == "to_file":
        path.write_text("0x0\n")
    elif kind == "dangling":
        os.symlink("nowhere-" + salt.hex()[:4], path)
    elif kind == "self_loop":
        os.symlink(path.name, path)
    elif kind == "fifo":
        os.mkfifo(path)


def footprints(node: FakeNode) -> dict[str, list[Path]]:
    """For each PCI function, the paths whose damage may change what its devices report."""
    prints: dict[str, list[Path]] = {}
    for port in node.ports.values():
        card = node.cards[port.bdf]
        function = node.function_path(port.bdf)
        paths = [port.path, card.path, card.class_link, function,
                 node.sysfs_root / "bus" / "pci" / "devices" / port.bdf,
                 node.dev_root / port.name, node.dev_root / "char" / port.dev]
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


def touched(footprint: list[Path], damaged: list[Path]) -> bool:
    return any(p == d or d in p.parents or p in d.parents for p in footprint for d in damaged)


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def captured() -> Iterator[Records]:
    handler = Records()
    logger = logging.getLogger("plugin.backends")
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)


def scan_all(node: FakeNode) -> list[Device]:
    config = node.config()
    return IntelBackend(config).scan() + AwsF1Backend(config).scan()


FAST_TMP = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
"""Trees are built for every example; a memory file system keeps that cheap where there is one."""

with tempfile.TemporaryDirectory() as _template:
    build(Path(_template))
    TEMPLATE_SIZE = len(entries(Path(_template)))


damage = st.lists(
    st.tuples(st.integers(0, TEMPLATE_SIZE - 1), st.sampled_from(KINDS), st.binary(max_size=8)),
    min_size=1, max_size=4,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(damage)
def test_discovery_survives_any_damage(damages: list[tuple[int, str, bytes]]) -> None:
    with tempfile.TemporaryDirectory(dir=FAST_TMP) as tmp:
        root = Path(tmp)
        node = build(root)
        intact = {d.id: d for d in scan_all(node)}
        by_function = footprints(node)
        prints = {i: by_function[i.split("-port")[0]] for i in intact}
        assert len(intact) == len(node.ports) + len(node.slots)
        paths = entries(root)
        damaged = [paths[i] for i, _, _ in damages if i < len(paths)]
        for index, kind, salt in damages:
            if index < len(paths):
                corrupt(paths[index], kind, salt)

        with captured() as log:
            devices = scan_all(node)

        assert not [r for r in log.records if r.levelno >= logging.ERROR], "discovery raised"
        ids = [d.id for d in devices]
        assert len(ids) == len(set(ids))
        assert set(ids) <= set(intact), "damage invented a device"
        for device in devices:
            assert ID.match(device.id) and len(device.id) <= 63
            assert device.healthy or device.health_reason
        for device_id, footprint in prints.items():
            if not touched(footprint, damaged):
                assert {d.id: d for d in devices}.get(device_id) == intact[device_id], device_id
        for record in log.records:
            if record.levelno == logging.WARNING:
                assert str(root) in record.getMessage(), record.getMessage()
