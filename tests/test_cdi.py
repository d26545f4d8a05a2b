"""CDI specs as a container runtime reads them: valid, minimal in version, whole on disk."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import pytest

from compat_tests.fake_alveo import build_alveo_node
from compat_tests.fake_sysfs import build_intel_node
from plugin.discovery.backends.alveo import AlveoBackend
from plugin.discovery.backends.intel import IntelBackend
from plugin.discovery.backends.units import UnitsBackend
from plugin.serving.cdi import (
    CdiPolicy,
    SpecWriter,
    device_name,
    device_names,
    kind_of,
    spec,
    spec_file_name,
)
from tests.cdi_conformance import check
from value_types.devices import Device, DeviceNode, DeviceSet, Mount

ACCELERATOR = "b-com.com/accelerator"
ALVEO = "amd.com/xilinx_u250_gen3x16_xdma_shell_4_1-1605029394"


def with_node(device_id: str) -> Device:
    """A device with a node to inject: CDI specs hold only such devices."""
    return Device(id=device_id, backend="intel", nodes=(DeviceNode("/dev/x", "/dev/x"),))


def with_nodes(count: int) -> DeviceSet:
    return DeviceSet.of([with_node(str(i)) for i in range(count)])


def built(resource: str, devices: DeviceSet) -> dict:
    content = spec(resource, devices)
    assert content is not None
    check(content)
    return content


def test_intel_ports_spec_carries_each_ports_node(tmp_path: Path) -> None:
    content = built(ACCELERATOR, DeviceSet.of(IntelBackend(build_intel_node(tmp_path).config())
                                              .scan()))
    assert content["cdiVersion"] == "0.5.0", "hostPath and digit-first names need 0.5.0"
    assert content["kind"] == ACCELERATOR, "a resource name the parser takes is the kind"
    by_name = {d["name"]: d["containerEdits"] for d in content["devices"]}
    assert by_name["0000-5e-00.0"] == {"deviceNodes": [
        {"path": "/dev/intel-fpga-port.0", "hostPath": "/dev/intel-fpga-port.0",
         "permissions": "rw"}]}
    assert "0000-3b-00.0-port1" in by_name
    assert all("env" not in edits for edits in by_name.values()), "env stays in Allocate"


def test_alveo_cards_and_units_give_valid_specs(tmp_path: Path) -> None:
    alveo = built(ALVEO, DeviceSet.of(AlveoBackend(build_alveo_node(tmp_path).config()).scan()))
    assert alveo["cdiVersion"] == "0.5.0" and alveo["kind"] == ALVEO
    first = alveo["devices"][0]
    assert first["name"] == "0000-17-00.1"
    assert first["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/dri/renderD128", "hostPath": "/dev/dri/renderD128", "permissions": "rw"}]
    assert spec(ACCELERATOR, DeviceSet.of(UnitsBackend(3).scan())) is None, \
        "units have nothing to inject: no spec, which the runtime would refuse"


def test_version_is_the_lowest_the_fields_need() -> None:
    lettered = DeviceSet.of([Device(id="port-a", backend="units",
                                    mounts=(Mount("/opt/x", "/opt/x", read_only=True),))])
    assert built("example.com/x", lettered)["cdiVersion"] == "0.3.0", "nothing newer used"
    mounted = DeviceSet.of([Device(id="port-a", backend="units",
                                   mounts=(Mount("/opt/x", "/opt/x", read_only=True),))])
    content = built("example.com/x", mounted)
    assert content["cdiVersion"] == "0.3.0"
    assert content["devices"][0]["containerEdits"]["mounts"] == [
        {"hostPath": "/opt/x", "containerPath": "/opt/x", "options": ["rbind", "ro"]}]
    assert spec("example.com/x", DeviceSet.of(())) is None, "a spec needs a device"


@pytest.mark.parametrize("resource", [
    ACCELERATOR, "b-com.com/afu-d8424dc4a4a3c413f89e433683f9040b", ALVEO])
def test_resource_names_the_parser_takes_are_their_own_kind(resource: str) -> None:
    assert kind_of(resource) == resource


def test_a_segment_starting_with_a_digit_gets_a_letter_and_a_digest() -> None:
    devices = DeviceSet.of([with_node("0")])
    resources = ["example.com/1gpu", "example.com/x1gpu", "3com.com/acc", "example.com/2gpu",
                 "example.com/9" + "a" * 62]
    kinds = [kind_of(r) for r in resources]
    assert len(set(kinds)) == len(kinds), "two resources never share a kind"
    assert kinds[1] == "example.com/x1gpu"
    for resource in resources:
        check(built(resource, devices))  # the parser's letter-first rule, class <= 63


@pytest.mark.parametrize("device_id", ["0000:5e:00.0", "a" * 300, "::", "é", "-x-", "x y"])
def test_every_id_gets_a_valid_name(device_id: str) -> None:
    check({"cdiVersion": "0.5.0", "kind": "a.com/b",
           "devices": [{"name": device_name(device_id),
                        "containerEdits": {"deviceNodes": [{"path": "/dev/x"}]}}]})


def test_names_that_would_clash_stay_distinct() -> None:
    devices = DeviceSet.of([Device(id="0000:5e:00.0", backend="x"),
                            Device(id="0000-5e-00.0", backend="x")])
    assert len(set(device_names(devices).values())) == 2


@pytest.mark.parametrize(("strategy", "specs", "names"), [
    ("both", True, ["b-com.com/accelerator=0000-5e-00.0"]),
    ("cdi", False, ["b-com.com/accelerator=0000-5e-00.0"]),
    ("device-specs", True, []),
])
def test_strategy_decides_what_allocate_sends(strategy: str, specs: bool,
                                              names: list[str]) -> None:
    policy = CdiPolicy.of(ACCELERATOR, DeviceSet.of([with_node("0000:5e:00.0")]),
                          strategy)
    assert policy.device_specs is specs
    assert policy.qualified(["0000:5e:00.0"]) == names


def test_spec_files_never_clash_and_are_replaced_whole(tmp_path: Path) -> None:
    assert spec_file_name("a.com/b-c") != spec_file_name("a.com-b/c")
    assert spec_file_name(ACCELERATOR) == "b-com.com_accelerator.json"
    writer = SpecWriter(tmp_path)
    path = tmp_path / spec_file_name(ACCELERATOR)
    sets = [DeviceSet.of([Device(id=str(i), backend="units",
                                 nodes=(DeviceNode(f"/dev/x{i}", f"/dev/x{i}", "rw"),))
                          for i in range(n)]) for n in (1, 400)]
    assert writer.write(ACCELERATOR, sets[0])
    seen: list[str] = []
    stop = threading.Event()

    def read_forever() -> None:
        while not stop.is_set():
            seen.append(path.read_text())

    reader = threading.Thread(target=read_forever)
    reader.start()
    try:
        for round_ in range(200):
            assert writer.write(ACCELERATOR, sets[round_ % 2])
    finally:
        stop.set()
        reader.join()
    assert len(seen) > 10
    for text in set(seen):
        check(json.loads(text))  # never a partial file
    assert len(set(seen)) == 2, "only the two whole versions were ever read"
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name], "no temporary left"
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    writer.remove_all()
    assert not path.exists()


def test_unchanged_devices_leave_the_file_alone_and_changes_rewrite_it(tmp_path: Path) -> None:
    writer = SpecWriter(tmp_path)
    path = tmp_path / spec_file_name(ACCELERATOR)
    two = with_nodes(2)
    assert writer.write(ACCELERATOR, two)
    inode = path.stat().st_ino
    assert writer.write(ACCELERATOR, with_nodes(2))
    assert path.stat().st_ino == inode, "same content: not rewritten"
    assert writer.write(ACCELERATOR, with_nodes(3))
    assert [d["name"] for d in json.loads(path.read_text())["devices"]] == ["0", "1", "2"]
    path.unlink()  # someone cleaned the directory: the next change puts it back
    assert writer.write(ACCELERATOR, two) and path.exists()


def test_an_unwritable_directory_is_reported_once_and_serving_goes_on(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    writer = SpecWriter(blocker / "cdi")  # a path below a regular file: never writable
    one = with_nodes(1)
    two = with_nodes(2)
    for _ in range(5):
        assert not writer.write(ACCELERATOR, one), "False: Allocate must not name them"
        assert not writer.write(ACCELERATOR, two)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "cannot write the CDI spec" in errors[0].getMessage()


@pytest.mark.parametrize("resource", [
    "example.com/fpga.v2", "amd.com/xilinx_u250_gen3x16_xdma_shell_4.1-1605029394",
    "b-com.com/a.b.c", "example.com/1.x"])
def test_a_dotted_name_keeps_the_spec_at_0_5_0(resource: str) -> None:
    """Runtimes on a CDI library before v0.6.0 (podman 4.x, CRI-O 1.26 and 1.27, containerd
    1.7.0 to 1.7.11) refuse a 0.6.0 spec, and a dot in the class is what asks for 0.6.0."""
    node = DeviceSet.of([Device(id="0000:5e:00.0", backend="intel",
                                nodes=(DeviceNode("/dev/x", "/dev/x"),))])
    content = built(resource, node)
    vendor, _, cls = content["kind"].partition("/")
    assert "." not in cls and vendor == resource.partition("/")[0]
    assert content["cdiVersion"] == "0.5.0"
    policy = CdiPolicy.of(resource, node, "both")
    assert policy.qualified(["0000:5e:00.0"]) == [f"{content['kind']}=0000-5e-00.0"]


def test_dotted_names_never_share_a_kind_with_their_dashed_spelling() -> None:
    resources = ["example.com/fpga.v2", "example.com/fpga-v2", "example.com/fpga_v2",
                 "example.com/fpga..v2"]
    kinds = [kind_of(r) for r in resources]
    assert len(set(kinds)) == len(kinds)
    assert kinds[1] == "example.com/fpga-v2" and kinds[2] == "example.com/fpga_v2"


def test_devices_with_nothing_to_inject_are_neither_in_the_spec_nor_named() -> None:
    mixed = DeviceSet.of([
        Device(id="0000:00:0f.0", backend="aws", nodes=(DeviceNode("/dev/xdma0", "/dev/xdma0"),)),
        Device(id="0000:00:11.0", backend="aws")])
    content = built("example.com/slot", mixed)
    assert [d["name"] for d in content["devices"]] == ["0000-00-0f.0"]
    policy = CdiPolicy.of("example.com/slot", mixed, "both")
    assert policy.qualified(["0000:00:0f.0", "0000:00:11.0"]) == ["example.com/slot=0000-00-0f.0"]
