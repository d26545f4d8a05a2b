"""Choosing a backend by name, and what each choice serves on each kind of node."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from compat_tests.fake_sysfs import F1_16XLARGE_SLOTS, FakeNode
from plugin.cli.config import BACKEND_CHOICES
from plugin.discovery.backends import BACKEND_NAMES, BackendConfig, make_backend, uevent_subsystems


def test_every_flag_choice_builds_a_backend(tmp_path: Path) -> None:
    assert set(BACKEND_NAMES) == set(BACKEND_CHOICES)
    config = BackendConfig(sysfs_root=tmp_path / "no-sys", dev_root=tmp_path / "no-dev")
    for name in BACKEND_NAMES:
        backend = make_backend(name, config)
        assert isinstance(backend.scan(), list)
        assert isinstance(backend.watch_paths(), list)


def test_unknown_backend_names_the_choices() -> None:
    with pytest.raises(ValueError, match="auto, intel, aws, alveo, units, none"):
        make_backend("xilinx", BackendConfig())


def test_auto_serves_intel_ports_when_the_node_has_them(intel_node: FakeNode) -> None:
    devices = make_backend("auto", intel_node.config()).scan()
    assert devices and {d.backend for d in devices} == {"intel"}


def test_auto_serves_f1_slots_on_an_f1_instance(f1_node: FakeNode) -> None:
    devices = make_backend("auto", f1_node.config()).scan()
    assert [d.id for d in devices] == list(F1_16XLARGE_SLOTS)


def test_auto_on_a_node_without_fpga_serves_nothing_and_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    node = FakeNode(tmp_path)
    backend = make_backend("auto", node.config())
    with caplog.at_level(logging.INFO, logger="plugin.discovery.backends"):
        for _ in range(3):
            assert backend.scan() == []
        assert caplog.text.count("no Intel FPGA port, AWS FPGA slot or Alveo card found") == 1
        assert str(node.sysfs_root / "class" / "fpga") in caplog.text
        node.add_dfl_card("0000:3b:00.0")
        assert [d.id for d in backend.scan()] == ["0000:3b:00.0"]
        node.remove_port("dfl-port.0")
        assert backend.scan() == []
        assert caplog.text.count("no Intel FPGA port, AWS FPGA slot or Alveo card found") == 2
    assert backend.static is False
    assert node.dev_root in backend.watch_paths()


def test_none_serves_nothing_and_never_changes() -> None:
    backend = make_backend("none", BackendConfig())
    assert backend.scan() == [] and backend.static


def test_uevent_subsystems_per_backend(tmp_path: Path) -> None:
    config = BackendConfig(sysfs_root=tmp_path, dev_root=tmp_path)
    assert "pci" in uevent_subsystems(make_backend("aws", config))
    assert {"pci", "fpga_region"} <= set(uevent_subsystems(make_backend("intel", config)))
    assert set(uevent_subsystems(make_backend("auto", config))) >= {"pci", "fpga"}
    assert uevent_subsystems(make_backend("units", config)) == ()
    assert uevent_subsystems(make_backend("none", config)) == ()
