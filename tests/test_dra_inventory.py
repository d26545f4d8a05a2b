"""The node's devices as DRA devices: names, attributes and health, from real discovery scans.

What is asserted is what a scheduler and a claim's CEL selector would see: the device names
claims and allocation results carry (DNS labels, stable, unique), and the attribute values a
DeviceClass can match on, for every backend as it scans the fake sysfs trees.
"""

from __future__ import annotations

import string
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from compat_tests.apiserver import fielderrors, rules_common
from compat_tests.fake_alveo import (
    DEFAULT_INTERFACE_UUID,
    DEFAULT_LOGIC_UUID,
    add_alveo_card,
    build_alveo_node,
    set_state,
    trip_firewall,
    unbind_xocl,
)
from compat_tests.fake_sysfs import (
    DEFAULT_AFU_ID,
    DEFAULT_INTERFACE_ID,
    OTHER_AFU_ID,
    FakeNode,
    build_broken_node,
    build_f1_16xlarge,
    build_f2_48xlarge,
    build_intel_node,
)
from plugin.discovery.backends import make_backend
from plugin.discovery.backends.units import UnitsBackend
from plugin.serving.dra.inventory import attributes_of, device_name, health_code, pool_of
from value_types.devices import Device, DeviceSet, Health
from value_types.pool import AttributeKind, AttributeValue, DraDevice, Pool, is_dns_label

DRIVER = "fpga.b-com.com"
NODE = "worker-1"


def scan(node: FakeNode, backend: str = "auto") -> DeviceSet:
    return DeviceSet.of(make_backend(backend, node.config()).scan())


def pool_for(node: FakeNode, backend: str = "auto") -> Pool:
    return pool_of(DRIVER, NODE, scan(node, backend))


def seen(device: DraDevice) -> dict[str, object]:
    """The attributes as a selector reads them: name -> plain value."""
    return {name: value.value for name, value in device.attributes.items()}


def by_name(pool: Pool) -> dict[str, DraDevice]:
    return {d.name: d for d in pool.devices}


# Names ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("device_id", "name"), [
    ("0000:5e:00.0", "pci-0000-5e-00-0"),
    ("0000:3b:00.0-port1", "pci-0000-3b-00-0-port1"),
    ("0000:be:00.2", "pci-0000-be-00-2"),
    ("10000:e1:1f.7", "pci-10000-e1-1f-7"),
    ("3", "unit-3"),
    ("0", "unit-0"),
    ("4095", "unit-4095"),
])
def test_ids_of_every_backend_get_readable_names(device_id: str, name: str) -> None:
    assert device_name(device_id) == name


@pytest.mark.parametrize(("device_id", "name"), [
    # Pinned: a name is what claims and checkpoints carry, so the rule must never drift.
    ("0000:5E:00.0", "dev-0000-5e-00-0-57e0889f15fa"),
    ("a_b", "dev-a-b-648fa9b31bc7"),
    ("03", "dev-03-0b8efa5a3bf1"),
    ("", "dev-e3b0c44298fc"),
])
def test_other_ids_get_a_readable_head_and_a_digest(device_id: str, name: str) -> None:
    assert device_name(device_id) == name


def test_spellings_that_would_collide_stay_apart() -> None:
    ids = ["0000:5e:00.0", "0000:5E:00.0", "0000-5e-00-0", "5e:00.0", "a.b", "a_b", "A.B",
           "3", "03", "unit-3", "0000:3b:00.0-port1", "0000:3b:00.0-port01"]
    names = [device_name(i) for i in ids]
    assert len(set(names)) == len(ids), dict(zip(ids, names, strict=True))


_HEX = "0123456789abcdef"
pci_ids = st.builds(
    lambda domain, bus, dev, fn, port: (
        f"{domain:04x}:{bus:02x}:{dev:02x}.{fn}" + (f"-port{port}" if port is not None else "")),
    st.integers(0, 0xFFFFFFFF), st.integers(0, 0xFF), st.integers(0, 0x1F), st.integers(0, 7),
    st.none() | st.integers(0, 999_999))
unit_ids = st.integers(0, 10**60).map(str)
any_ids = st.text(min_size=1, max_size=300) | st.text(alphabet=_HEX + ":.-_ABCDEF", max_size=30)
device_ids = pci_ids | unit_ids | any_ids


@given(device_ids)
def test_every_id_gives_a_dns_label_and_always_the_same_one(device_id: str) -> None:
    name = device_name(device_id)
    assert is_dns_label(name), name
    assert rules_common.validate_dns_label(name, "name") == []
    assert device_name(device_id) == name


@given(st.lists(device_ids, unique=True, max_size=40))
def test_distinct_ids_get_distinct_names(ids: list[str]) -> None:
    names = {device_name(i) for i in ids}
    assert len(names) == len(ids)


@given(st.lists(pci_ids | unit_ids, unique=True, min_size=1, max_size=20))
def test_a_devices_name_does_not_depend_on_the_other_devices(ids: list[str]) -> None:
    whole = pool_of(DRIVER, NODE, DeviceSet.of(Device(id=i, backend="x") for i in ids))
    alone = pool_of(DRIVER, NODE, DeviceSet.of([Device(id=ids[0], backend="x")]))
    assert alone.devices[0].name == by_name_id(whole)[ids[0]]
    assert dict(whole.names) == {device_name(i): i for i in ids}
    assert all(whole.device_id(name) == i for name, i in whole.names.items())


def by_name_id(pool: Pool) -> dict[str, str]:
    return {d.device_id: d.name for d in pool.devices}


def test_a_name_not_in_the_pool_maps_to_nothing(tmp_path: Path) -> None:
    pool = pool_for(build_intel_node(tmp_path))
    assert pool.device_id("pci-0000-5e-00-0") == "0000:5e:00.0"
    assert pool.device_id("pci-0000-5e-00-1") is None
    assert pool.device("pci-0000-3b-00-0-port1").device_id == "0000:3b:00.0-port1"


# Attributes from real scans ------------------------------------------------------------------

def test_intel_opae_and_dfl_ports(tmp_path: Path) -> None:
    pool = by_name(pool_for(build_intel_node(tmp_path), "intel"))
    assert sorted(pool) == ["pci-0000-3b-00-0", "pci-0000-3b-00-0-port1", "pci-0000-5e-00-0",
                            "pci-0000-be-00-1", "pci-0000-be-00-2", "pci-0000-d8-00-0"]
    assert seen(pool["pci-0000-5e-00-0"]) == {
        "family": "intel", "kernelDriver": "intel-fpga", "card": "DSC_1_X",
        "pciVendorID": "0x8086", "pciDeviceID": "0x09c4",
        "afuID": DEFAULT_AFU_ID, "interfaceID": DEFAULT_INTERFACE_ID,
        "resource.kubernetes.io/pciBusID": "0000:5e:00.0",
        "resource.kubernetes.io/numaNode": 0, "programmable": False,
    }
    port1 = seen(pool["pci-0000-3b-00-0-port1"])
    assert port1["kernelDriver"] == "dfl"
    assert port1["resource.kubernetes.io/pciBusID"] == "0000:3b:00.0"  # the function's address
    vf = seen(pool["pci-0000-be-00-2"])
    assert vf["pciDeviceID"] == "0x09c5"
    assert vf["interfaceID"] == DEFAULT_INTERFACE_ID  # the physical function's region
    assert vf["resource.kubernetes.io/numaNode"] == 1
    assert seen(pool["pci-0000-d8-00-0"])["afuID"] == OTHER_AFU_ID
    assert all(d.healthy and d.health_code == "" for d in pool.values())


def test_ofs_card_is_named_from_its_subsystem(tmp_path: Path) -> None:
    node = FakeNode(tmp_path)
    node.add_dfl_card("0000:17:00.0", device="0xbcce", vf_device="0xbccf",
                      subsystem_device="0x1771")
    [device] = pool_for(node, "intel").devices
    assert seen(device)["card"] == "OFS N6001"
    assert seen(device)["pciDeviceID"] == "0xbcce"


def test_aws_f1_slots(tmp_path: Path) -> None:
    pool = pool_for(build_f1_16xlarge(tmp_path), "aws")
    assert [d.name for d in pool.devices] == [
        f"pci-0000-00-{0x0f + 2 * i:02x}-0" for i in range(8)]
    assert [seen(d)["slot"] for d in pool.devices] == list(range(8))
    first = seen(pool.devices[0])
    assert first == {
        "family": "aws", "platform": "f1", "slot": 0,
        "pciVendorID": "0x1d0f", "pciDeviceID": "0x1042",
        "resource.kubernetes.io/pciBusID": "0000:00:0f.0",
        "resource.kubernetes.io/numaNode": 0, "programmable": False,
    }
    assert "kernelDriver" not in first  # AWS's "driver" fact names the platform, not a driver
    assert seen(pool.devices[7])["resource.kubernetes.io/numaNode"] == 1


def test_aws_f2_slot_shows_the_loaded_images_ids(tmp_path: Path) -> None:
    node = build_f2_48xlarge(tmp_path)
    node.load_afi("0000:34:00.0", "0x1234", "0x5678", subsystem_vendor="0xfedc",
                  subsystem_device="0x1d51")
    pool = by_name(pool_for(node, "aws"))
    loaded = seen(pool["pci-0000-34-00-0"])
    assert loaded["platform"] == "f2"
    assert (loaded["pciVendorID"], loaded["pciDeviceID"]) == ("0x1234", "0x5678")
    assert (loaded["pciSubsystemVendorID"], loaded["pciSubsystemDeviceID"]) == (
        "0xfedc", "0x1d51")
    cleared = seen(pool["pci-0000-35-00-0"])
    assert cleared["pciDeviceID"] == "0x9048"
    assert "pciSubsystemDeviceID" not in cleared


def test_alveo_cards(tmp_path: Path) -> None:
    pool = pool_for(build_alveo_node(tmp_path, count=2), "alveo")
    assert seen(pool.devices[0]) == {
        "family": "alveo", "kernelDriver": "xocl",
        "pciVendorID": "0x10ee", "pciDeviceID": "0x5005",
        "shell": "xilinx_u250_gen3x16_xdma_shell_4_1", "shellTimestamp": 1605029394,
        "logicUUID": DEFAULT_LOGIC_UUID, "interfaceUUID": DEFAULT_INTERFACE_UUID,
        "resource.kubernetes.io/pciBusID": "0000:17:00.1",
        "resource.kubernetes.io/numaNode": 0, "programmable": False,
    }
    assert pool.devices[0].attributes["shellTimestamp"].kind is AttributeKind.INT


def test_a_shell_name_the_server_would_refuse_is_left_out_not_cut(tmp_path: Path) -> None:
    node = FakeNode(tmp_path)
    add_alveo_card(node, "0000:17:00.1", shell="xilinx_" + "u" * 80)
    [device] = pool_for(node, "alveo").devices
    assert "shell" not in device.attributes
    assert seen(device)["shellTimestamp"] == 1605029394


def test_units() -> None:
    pool = pool_of(DRIVER, NODE, DeviceSet.of(UnitsBackend(12).scan()))
    assert [d.name for d in pool.devices] == [f"unit-{i}" for i in range(12)]
    assert all(seen(d) == {"family": "units", "programmable": False} for d in pool.devices)


def test_no_numa_node_means_no_numa_attribute(tmp_path: Path) -> None:
    pool = by_name(pool_for(build_broken_node(tmp_path), "intel"))
    assert "resource.kubernetes.io/numaNode" not in pool["pci-0000-d8-00-0"].attributes


def test_pcie_root_only_as_discovery_read_it() -> None:
    def root(value: str) -> dict[str, object]:
        device = Device(id="0000:5e:00.0", backend="intel",
                        attributes=(("pci_address", "0000:5e:00.0"), ("pcie_root", value)))
        return {k: v.value for k, v in attributes_of(device).items()}

    assert root("pci0000:5d")["resource.kubernetes.io/pcieRoot"] == "pci0000:5d"
    assert root("pci10000:00")["resource.kubernetes.io/pcieRoot"] == "pci10000:00"
    for bad in ("0000:5d", "pci0000:5d:00.0", "PCI0000:5D", ""):
        assert "resource.kubernetes.io/pcieRoot" not in root(bad)


def test_every_attribute_name_and_value_is_one_a_server_accepts(tmp_path: Path) -> None:
    from compat_tests.fake_alveo import build_mixed_node

    devices = list(pool_for(build_mixed_node(tmp_path)).devices)
    devices += pool_of(DRIVER, NODE, DeviceSet.of(UnitsBackend(2).scan())).devices
    for device in devices:
        assert len(device.attributes) + len(device.capacity) <= 32
        for name, value in device.attributes.items():
            assert rules_common.validate_qualified_name(name, "a") == [], name
            if value.kind is AttributeKind.STRING:
                assert len(str(value.value).encode()) <= 64
        assert dict(device.capacity) == {}  # no FPGA resource is shared by amount


# Health --------------------------------------------------------------------------------------

def test_broken_ports_keep_their_reason_and_a_short_code(tmp_path: Path) -> None:
    pool = by_name(pool_for(build_broken_node(tmp_path), "intel"))
    codes = {name: d.health_code for name, d in pool.items() if not d.healthy}
    assert codes == {
        "pci-0000-3b-00-0": "afu-crashed",
        "pci-0000-5e-00-0": "port-error",
        "pci-0000-86-00-0": "device-node-missing",
        "pci-0000-af-00-0": "afu-id-unreadable",
    }
    assert "0x4" in pool["pci-0000-5e-00-0"].health_reason
    assert pool["pci-0000-12-00-0"].healthy


@pytest.mark.parametrize(("fault", "code"), [
    (lambda node: set_state(node, "0000:17:00.1", "ready", "0"), "card-not-ready"),
    (lambda node: set_state(node, "0000:17:00.1", "dev_offline", "1"), "card-offline"),
    (lambda node: set_state(node, "0000:17:00.1", "device_bad_state", "1"), "card-bad-state"),
    (lambda node: set_state(node, "0000:17:00.1", "ready", "banana"), "card-state-unreadable"),
    (lambda node: trip_firewall(node, "0000:17:00.1"), "firewall-tripped"),
    (lambda node: unbind_xocl(node, "0000:17:00.1"), "driver-unbound"),
])
def test_alveo_faults_have_codes(tmp_path: Path, fault, code: str) -> None:
    node = build_alveo_node(tmp_path, count=1)
    fault(node)
    [device] = pool_for(node, "alveo").devices
    assert not device.healthy
    assert device.health_code == code, device.health_reason


def test_aws_faults_have_codes(tmp_path: Path) -> None:
    node = build_f2_48xlarge(tmp_path)
    node.remove_application_function("0000:34:00.0")
    node.load_afi("0000:35:00.0", "0x1234", "0x5678")
    (node.function_path("0000:35:00.0") / "resource0").unlink()
    pool = by_name(pool_for(node, "aws"))
    assert pool["pci-0000-34-00-0"].health_code == "image-loading"
    assert pool["pci-0000-35-00-0"].health_code == "bar0-missing"


def test_first_cause_wins_and_unknown_causes_are_plain_unhealthy() -> None:
    assert health_code("device discovery stalled: scan has not returned for 10 s "
                       "(stuck on /sys/x/errors/errors)") == "discovery-stalled"
    assert health_code("port error register /sys/a reads 0x1; device node /dev/b missing") \
        == "port-error"
    assert health_code("device node /dev/b missing; port error register /sys/a reads 0x1") \
        == "device-node-missing"
    assert health_code("the card is sad") == "unhealthy"


@given(st.text(max_size=200))
def test_every_health_code_is_a_taint_value(reason: str) -> None:
    assert fielderrors.label_value(health_code(reason)) == []


# Values and the pool -------------------------------------------------------------------------

@pytest.mark.parametrize(("make", "value"), [
    (AttributeValue.string, "x" * 65),
    (AttributeValue.string, "é" * 33),  # 66 bytes: the limit counts bytes
    (AttributeValue.version, "1.0"),
    (AttributeValue.version, "v1.0.0"),
    (AttributeValue.integer, 2**63),
    (AttributeValue.integer, True),
    (AttributeValue.boolean, 1),
])
def test_values_a_server_would_refuse_cannot_be_made(make, value) -> None:
    with pytest.raises(ValueError):
        make(value)


def test_values_a_server_accepts() -> None:
    assert AttributeValue.version("1.2.3-rc.1+build.5").value == "1.2.3-rc.1+build.5"
    assert AttributeValue.string("x" * 64).kind is AttributeKind.STRING
    assert AttributeValue.integer(-(2**63)).value == -(2**63)
    assert AttributeValue.boolean(False).value is False


@pytest.mark.parametrize("driver", ["FPGA.b-com.com", "fpga_b-com.com", "a" * 64, "", "-x.com"])
def test_driver_names_the_server_refuses_are_refused_early(driver: str) -> None:
    with pytest.raises(ValueError, match="driver name"):
        pool_of(driver, NODE, DeviceSet())


def test_node_and_pool_names() -> None:
    with pytest.raises(ValueError, match="node name"):
        pool_of(DRIVER, "Worker_1", DeviceSet())
    assert pool_of(DRIVER, NODE, DeviceSet()).name == NODE
    assert pool_of(DRIVER, NODE, DeviceSet(), pool_name="rack-1/worker-1").name == "rack-1/worker-1"
    with pytest.raises(ValueError, match="pool name"):
        pool_of(DRIVER, NODE, DeviceSet(), pool_name="rack_1")


def test_the_pool_is_a_value_of_the_snapshot(tmp_path: Path) -> None:
    node = build_intel_node(tmp_path)
    first, again = pool_for(node), pool_for(node)
    assert first == again and hash(first) == hash(again)
    node.set_port_error(next(iter(node.ports)), 0x2)
    changed = pool_for(node)
    assert changed != first
    assert [d.name for d in changed.devices] == [d.name for d in first.devices]


def test_a_device_model_unhealthy_flag_reaches_the_pool() -> None:
    devices = DeviceSet.of([Device(id="0", backend="units", health=Health.UNHEALTHY,
                                   health_reason="AFU ID is all f: firmware crashed")])
    [device] = pool_of(DRIVER, NODE, devices).devices
    assert (device.healthy, device.health_code) == (False, "afu-crashed")


def test_digest_heads_only_use_label_characters() -> None:
    name = device_name("Ünïcode ID/with:odd.chars " + string.punctuation)
    assert is_dns_label(name) and name.startswith("dev-")


@pytest.mark.parametrize(("attributes", "capacity", "problem"), [
    ({"afu-id": AttributeValue.string("x")}, {}, "not a qualified name"),
    ({"Example.com/afuID": AttributeValue.string("x")}, {}, "not a qualified name"),
    ({"a/b/c": AttributeValue.string("x")}, {}, "not a qualified name"),
    ({"x" * 33: AttributeValue.string("x")}, {}, "not a qualified name"),
    ({}, {"memory": "8 GiB"}, "not a quantity"),
    ({f"a{i}": AttributeValue.integer(i) for i in range(30)}, {"b": "1", "c": "2", "d": "3"},
     "more than 32"),
])
def test_a_device_the_server_would_refuse_cannot_be_made(attributes, capacity,
                                                         problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        DraDevice(name="pci-0000-5e-00-0", device_id="0000:5e:00.0", attributes=attributes,
                  capacity=capacity)


def test_a_device_the_server_accepts() -> None:
    device = DraDevice(name="unit-0", device_id="0", capacity={"memory": "8Gi", "lanes": "16"},
                       attributes={"resource.kubernetes.io/numaNode": AttributeValue.integer(0),
                                   "_x1": AttributeValue.boolean(True)})
    assert list(device.capacity) == ["lanes", "memory"]
    with pytest.raises(TypeError):
        device.attributes["family"] = AttributeValue.string("x")  # type: ignore[index]


def test_a_string_that_cannot_be_sent_is_left_out() -> None:
    device = Device(id="0000:17:00.1", backend="alveo",
                    attributes=(("shell", "xilinx_\udcff"), ("driver", "xocl")))
    assert "shell" not in attributes_of(device)
    with pytest.raises(ValueError, match="UTF-8"):
        AttributeValue.string("\udcff")
