"""What ``discover`` prints for a node, as an operator reads it."""

from __future__ import annotations

import json
from pathlib import Path

from compat_tests.fake_alveo import DEFAULT_SHELL, DEFAULT_TIMESTAMP, add_alveo_card
from compat_tests.fake_sysfs import (
    CRASHED_AFU_ID,
    DEFAULT_AFU_ID,
    FakeNode,
    build_intel_node,
)
from plugin.cli.discover import render_json, render_table
from plugin.discovery.backends.alveo import AlveoBackend
from plugin.discovery.backends.intel import IntelBackend
from plugin.discovery.backends.units import UnitsBackend


def test_table_shows_every_column_for_every_port(tmp_path: Path) -> None:
    node = build_intel_node(tmp_path)
    node.set_afu_id("dfl-port.2", CRASHED_AFU_ID)
    devices = IntelBackend(node.config()).scan()
    lines = render_table(devices).splitlines()
    assert lines[0].split() == ["ID", "BACKEND", "DRIVER", "NODE", "NUMA", "LOADED",
                                "PROGRAMMABLE", "HEALTH", "WHY"]
    assert len(lines) == 1 + len(devices)
    first = lines[1].split()
    assert first[:9] == ["0000:3b:00.0", "intel", "dfl", "/dev/dfl-port.0", "0", "afu",
                         DEFAULT_AFU_ID, "no", "Healthy"]
    crashed = next(line for line in lines if line.startswith("0000:d8:00.0"))
    assert "Unhealthy" in crashed and crashed.endswith("AFU ID is all f: firmware crashed")
    # Columns are aligned: every HEALTH cell starts under the header.
    assert all(line[lines[0].index("HEALTH"):].split()[0] in ("HEALTH", "Healthy", "Unhealthy")
               for line in lines)


def test_table_says_when_there_is_nothing() -> None:
    assert render_table([]).splitlines()[-1] == "(no accelerators found)"


def test_units_show_dashes_where_there_is_no_fact() -> None:
    line = render_table(UnitsBackend(1).scan()).splitlines()[1].split()
    assert line == ["0", "units", "-", "-", "-", "-", "no", "Healthy", "-"]


def test_json_keeps_every_fact(tmp_path: Path) -> None:
    node = build_intel_node(tmp_path)
    node.delete_device_node("intel-fpga-port.0")
    records = json.loads(render_json(IntelBackend(node.config()).scan()))
    by_id = {r["id"]: r for r in records}
    assert len(records) == 6
    healthy = by_id["0000:d8:00.0"]
    assert healthy["driver"] == "dfl" and healthy["numa_node"] == 1
    assert healthy["nodes"] == [{"host_path": "/dev/dfl-port.2",
                                 "container_path": "/dev/dfl-port.2", "permissions": "rw"}]
    assert healthy["health"] == "Healthy" and healthy["health_reason"] is None
    assert healthy["attributes"]["interface_id"]
    broken = by_id["0000:5e:00.0"]
    assert broken["health"] == "Unhealthy" and "intel-fpga-port.0" in broken["health_reason"]
    assert broken["nodes"] == []
    assert json.loads(render_json([])) == []


def test_alveo_cards_show_their_render_node_and_shell(tmp_path: Path) -> None:
    node = FakeNode(tmp_path)
    add_alveo_card(node, "0000:17:00.1")
    [line] = render_table(AlveoBackend(node.config()).scan()).splitlines()[1:]
    assert line.split() == ["0000:17:00.1", "alveo", "xocl", "/dev/dri/renderD128", "0",
                            "shell", DEFAULT_SHELL, f"({DEFAULT_TIMESTAMP})", "no", "Healthy",
                            "-"]
