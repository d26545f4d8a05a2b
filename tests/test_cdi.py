"""CDI specs as a container runtime reads them: valid, minimal in version, whole on disk."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import jsonschema
import pytest

from plugin.backends.alveo import AlveoBackend
from plugin.backends.fake_alveo import build_alveo_node
from plugin.backends.fake_sysfs import build_intel_node
from plugin.backends.intel import IntelBackend
from plugin.backends.units import UnitsBackend
from plugin.cdi import SpecWriter, device_name, device_names, spec, spec_file_name
from plugin.model import Device, DeviceNode, DeviceSet

SCHEMA = json.loads((Path(__file__).parent / "data" / "cdi-spec-1.1.0.schema.json").read_text())


def validate(content: object) -> None:
    jsonschema.validate(content, SCHEMA)


def test_intel_ports_spec_carries_each_ports_node(tmp_path: Path) -> None:
    devices = DeviceSet.of(IntelBackend(build_intel_node(tmp_path).config()).scan())
    content = spec("b-com.com/accelerator", devices)
    validate(content)
    assert content is not None
    assert content["cdiVersion"] == "0.5.0", "hostPath and digit-first names need 0.5.0"
    assert content["kind"] == "b-com.com/accelerator"
    by_name = {d["name"]: d["containerEdits"] for d in content["devices"]}
    assert by_name["0000-5e-00.0"] == {"deviceNodes": [
        {"path": "/dev/intel-fpga-port.0", "hostPath": "/dev/intel-fpga-port.0",
         "permissions": "rw"}]}
    assert "0000-3b-00.0-port1" in by_name
    assert all("env" not in edits for edits in by_name.values())


def test_alveo_cards_and_units_give_valid_specs(tmp_path: Path) -> None:
    alveo = DeviceSet.of(AlveoBackend(build_alveo_node(tmp_path).config()).scan())
    content = spec("amd.com/xilinx_u250_gen3x16_xdma_shell_4_1-1605029394", alveo)
    validate(content)
    assert content is not None and content["cdiVersion"] == "0.5.0"
    assert content["devices"][0]["containerEdits"]["deviceNodes"][0]["path"] \
        == "/dev/dri/renderD128"
    units = spec("b-com.com/accelerator", DeviceSet.of(UnitsBackend(3).scan()))
    validate(units)
    assert units is not None and [d["name"] for d in units["devices"]] == ["0", "1", "2"]


def test_a_dotted_kind_name_needs_0_6_0_and_no_devices_no_spec() -> None:
    devices = DeviceSet.of([Device(id="0", backend="units")])
    dotted = spec("example.com/shell.v2", devices)
    validate(dotted)
    assert dotted is not None and dotted["cdiVersion"] == "0.6.0"
    assert spec("example.com/x", DeviceSet.of(())) is None


@pytest.mark.parametrize("device_id", ["0000:5e:00.0", "a" * 300, "::", "é", "-x-", "x y"])
def test_every_id_gets_a_valid_name(device_id: str) -> None:
    name = device_name(device_id)
    validate({"cdiVersion": "0.5.0", "kind": "a.com/b",
              "devices": [{"name": name, "containerEdits": {}}]})


def test_names_that_would_clash_stay_distinct() -> None:
    devices = DeviceSet.of([Device(id="0000:5e:00.0", backend="x"),
                            Device(id="0000-5e-00.0", backend="x")])
    names = device_names(devices)
    assert len(set(names.values())) == 2


def test_spec_files_never_clash_and_are_replaced_whole(tmp_path: Path) -> None:
    assert spec_file_name("a.com/b-c") != spec_file_name("a.com-b/c")
    writer = SpecWriter(tmp_path)
    path = tmp_path / spec_file_name("b-com.com/accelerator")
    sets = [DeviceSet.of([Device(id=str(i), backend="units",
                                 nodes=(DeviceNode(f"/dev/x{i}", f"/dev/x{i}", "rw"),))
                          for i in range(n)]) for n in (1, 200)]
    writer.write("b-com.com/accelerator", sets[0])
    seen: list[str] = []
    stop = threading.Event()

    def read_forever() -> None:
        while not stop.is_set():
            seen.append(path.read_text())

    reader = threading.Thread(target=read_forever)
    reader.start()
    try:
        for round_ in range(100):
            writer.write("b-com.com/accelerator", sets[round_ % 2])
    finally:
        stop.set()
        reader.join()
    assert len(seen) > 10
    for text in set(seen):
        validate(json.loads(text))  # never a partial file
    assert len(set(seen)) == 2, "only the two whole versions were ever read"
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name], "no temporary left"
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    writer.remove_all()
    assert not path.exists()


def test_an_unwritable_directory_is_reported_once_and_serving_goes_on(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    writer = SpecWriter(blocker / "cdi")  # a path below a regular file: never writable
    devices = DeviceSet.of([Device(id="0", backend="units")])
    for _ in range(5):
        writer.write("b-com.com/accelerator", devices)
        writer.write("b-com.com/accelerator", DeviceSet.of(
            [Device(id="0", backend="units"), Device(id="1", backend="units")]))
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "cannot write the CDI spec" in errors[0].getMessage()
