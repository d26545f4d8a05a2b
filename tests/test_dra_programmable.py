"""Programmable devices as DRA publishes them, ``--programming`` and what ``discover`` says.

A DeviceClass selects where a function can go by the device's interface, what it holds and
``programmable``; every slice carrying them must still pass the servers' own schemas."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from api_versions.resource_slices import slices_for
from compat_tests.apiserver import validate
from compat_tests.fake_alveo import (
    DEFAULT_INTERFACE_UUID,
    DEFAULT_LOGIC_UUID,
    build_mixed_node,
    load_xclbin,
)
from compat_tests.fake_sysfs import (
    DEFAULT_AFU_ID,
    DEFAULT_INTERFACE_ID,
    FakeNode,
    build_intel_node,
)
from plugin.cli.config import parse
from plugin.cli.discover import render_json, render_table
from plugin.discovery.backends import make_backend
from plugin.model.programming import Programmable
from plugin.programming.setup import why_not_programmable
from plugin.serving.dra.inventory import pool_of
from value_types.devices import DeviceSet
from value_types.pool import AttributeKind, DraDevice, Pool

DRIVER = "fpga.b-com.com"
NODE = "worker-1"
UID = "6f1c2a9e-1d0b-4c47-9d8e-2b7f0e5a3c11"
XCLBIN = "8b5a2f60-3d1e-4c0a-9f3b-6a7e2d1c0b94"
ALVEO = "pci-0000-17-00-1"


def mixed(root: Path) -> FakeNode:
    """Every family, a virtual function's port too, and an xclbin loaded on one card."""
    node = build_mixed_node(root)
    node.add_dfl_card("0000:be:00.0", vfs=1, numa_node=1)
    load_xclbin(node, "0000:17:00.1", XCLBIN)
    return node


def rule(node: FakeNode, programming: bool) -> Programmable:
    """What serve publishes as programmable, with the loaders its flags choose (no vendor
    tool at the default paths on this machine; the FME nodes under the fake /dev)."""
    settings = parse(["discover", "--programming", "on" if programming else "off",
                      "--dev-root", str(node.dev_root)])
    why_not = why_not_programmable(settings)
    return lambda device: why_not(device) is None


def pool(root: Path, programming: bool) -> Pool:
    node = mixed(root)
    devices = DeviceSet.of(make_backend("auto", node.config()).scan())
    return pool_of(DRIVER, NODE, devices, programmable=rule(node, programming))


def seen(device: DraDevice) -> dict[str, object]:
    return {name: value.value for name, value in device.attributes.items()}


def programmable(p: Pool) -> dict[str, bool]:
    return {d.name: bool(d.attributes["programmable"].value) for d in p.devices}


def test_programmable_is_false_everywhere_while_programming_is_off(tmp_path: Path) -> None:
    off = pool(tmp_path, programming=False)
    assert off.devices and not any(programmable(off).values())
    assert all(d.attributes["programmable"].kind is AttributeKind.BOOL for d in off.devices)


def test_programming_on_makes_intel_ports_with_an_fme_programmable_only(tmp_path: Path) -> None:
    on = programmable(pool(tmp_path, programming=True))
    assert {name for name, value in on.items() if value} == {"pci-0000-5e-00-0",
                                                             "pci-0000-d8-00-0"}
    # A virtual function (no FME), Alveo cards and AWS slots (no xbutil, no SDK here) stay
    # false.
    assert on["pci-0000-be-00-1"] is False and on[ALVEO] is False
    assert on["pci-0000-00-0f-0"] is False and on["pci-0000-34-00-0"] is False


def test_a_port_whose_fme_node_went_is_not_programmable(tmp_path: Path) -> None:
    node = build_intel_node(tmp_path)
    node.delete_fme_node("0000:3b:00.0")
    p = pool_of(DRIVER, NODE, DeviceSet.of(make_backend("intel", node.config()).scan()),
                programmable=rule(node, True))
    on = programmable(p)
    assert on["pci-0000-3b-00-0"] is False and on["pci-0000-3b-00-0-port1"] is False
    assert on["pci-0000-d8-00-0"] is True


def test_what_each_device_holds_and_its_interface_are_published(tmp_path: Path) -> None:
    devices = {d.name: seen(d) for d in pool(tmp_path, programming=True).devices}
    port = devices["pci-0000-d8-00-0"]
    assert (port["afuID"], port["interfaceID"]) == (DEFAULT_AFU_ID, DEFAULT_INTERFACE_ID)
    card = devices[ALVEO]
    assert card["logicUUID"] == DEFAULT_LOGIC_UUID
    assert card["interfaceUUID"] == DEFAULT_INTERFACE_UUID
    assert card["xclbinUUID"] == XCLBIN
    assert "xclbinUUID" not in devices["pci-0000-af-00-1"]  # nothing loaded there
    assert not any("fme" in name.lower() for d in devices.values() for name in d)


@pytest.mark.parametrize("version", ["v1", "v1beta2", "v1beta1"])
@pytest.mark.parametrize("model", ["1.34", "1.35", "1.36"])
def test_the_slices_pass_the_servers_schemas(tmp_path: Path, version: str, model: str) -> None:
    for programming in (False, True):
        for obj in slices_for(version, pool(tmp_path / str(programming), programming), 1, UID,
                              taints=True):
            assert validate(obj, model=model, schema_required=True) == [], obj


# --programming and discover -------------------------------------------------------------------

def test_the_flag_is_off_by_default_and_takes_on_from_flag_or_variable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse(["serve"]).programming == "off"
    assert parse(["serve", "--programming", "on"]).programming == "on"
    monkeypatch.setenv("ACCELERATOR_DP_PROGRAMMING", "on")
    assert parse(["serve"]).programming == "on"
    assert parse(["discover"]).programming == "on"
    assert parse(["serve", "--programming", "off"]).programming == "off"


def test_a_bad_value_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse(["serve", "--programming", "yes"])
    assert exited.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_discover_shows_what_is_held_and_whether_it_can_be_programmed(tmp_path: Path) -> None:
    node = mixed(tmp_path)
    devices = make_backend("auto", node.config()).scan()
    on = why_not_programmable(parse(["discover", "--programming", "on", "--dev-root",
                                     str(node.dev_root)]))
    table = render_table(devices, why_not=on).splitlines()
    column = table[0].index("PROGRAMMABLE")
    cells = {line.split()[0]: line[column:].split()[0] for line in table[1:]}
    assert cells["0000:d8:00.0"] == "yes" and cells["0000:be:00.1"] == "no"
    assert cells["0000:17:00.1"] == "no"
    alveo = next(line for line in table if line.startswith("0000:17:00.1"))
    assert f"xclbin {XCLBIN}" in alveo
    assert "yes" not in render_table(devices).split("PROGRAMMABLE", 1)[1]
    records = {r["id"]: r for r in json.loads(render_json(devices, on))}
    assert records["0000:d8:00.0"]["programmable"] is True
    assert records["0000:17:00.1"]["xclbin_uuid"] == XCLBIN
    assert records["0000:17:00.1"]["programmable"] is False
    assert "xbutil" in records["0000:17:00.1"]["not_programmable_because"]
    assert records["0000:d8:00.0"]["not_programmable_because"] is None
    # The keys discover --json had keep their meaning; these two are only added.
    assert {"id", "backend", "driver", "nodes", "numa_node", "afu_id", "shell", "health",
            "health_reason", "attributes"} <= set(records["0000:d8:00.0"])


def test_alveo_and_aws_are_programmable_where_their_tools_are(tmp_path: Path) -> None:
    node = mixed(tmp_path / "node")
    tools = tmp_path / "tools"
    tools.mkdir()
    for name in ("xbutil", "fpga-load-local-image", "fpga-describe-local-image"):
        (tools / name).write_text("#!/bin/sh\nexit 0\n")
        (tools / name).chmod(0o755)
    settings = parse(["discover", "--programming", "on", "--dev-root", str(node.dev_root),
                      "--xbutil", str(tools / "xbutil"),
                      "--fpga-load-local-image", str(tools / "fpga-load-local-image"),
                      "--fpga-describe-local-image", str(tools / "fpga-describe-local-image")])
    why_not = why_not_programmable(settings)
    devices = DeviceSet.of(make_backend("auto", node.config()).scan())
    on = programmable(pool_of(DRIVER, NODE, devices,
                              programmable=lambda d: why_not(d) is None))
    assert on[ALVEO] is True
    assert on["pci-0000-00-0f-0"] is True and on["pci-0000-34-00-0"] is True
    (tools / "xbutil").chmod(0o644)  # not executable: not a way in
    assert why_not(devices.get("0000:17:00.1")) is not None


def test_discover_asks_the_aws_sdk_which_agfi_a_slot_holds(tmp_path: Path) -> None:
    import asyncio

    from compat_tests.fake_fpga_tools import write_stand_in_tools
    from plugin.programming.setup import functions_only_tools_tell

    node = mixed(tmp_path / "node")
    tools = write_stand_in_tools(tmp_path / "tools", node)
    args = ["discover", "--programming", "on", "--dev-root", str(node.dev_root),
            "--fpga-load-local-image", str(tools.load),
            "--fpga-describe-local-image", str(tools.describe)]
    settings = parse(args)
    devices = make_backend("auto", node.config()).scan()
    assert asyncio.run(functions_only_tools_tell(settings, devices)) == {}  # nothing loaded
    agfi = "agfi-0fcf87119b8e97bf3"
    subprocess.run([str(tools.load), "-S", "0", "-I", agfi, "-H"], check=True,
                   capture_output=True)
    told = asyncio.run(functions_only_tools_tell(settings, devices))
    assert told == {"0000:00:0f.0": agfi}
    table = render_table(devices, why_not=why_not_programmable(settings), told=told)
    assert agfi in next(line for line in table.splitlines() if line.startswith("0000:00:0f.0"))
    records = {r["id"]: r for r in json.loads(render_json(devices, told=told))}
    assert records["0000:00:0f.0"]["agfi_id"] == agfi
    assert records["0000:34:00.0"]["agfi_id"] is None
    assert asyncio.run(functions_only_tools_tell(parse(args[:1] + args[3:]), devices)) == {}
