"""What a container gets for discovered FPGA ports and slots, and where requests are packed."""

from __future__ import annotations

import pytest

from compat_tests.fake_sysfs import CRASHED_AFU_ID, FakeNode
from plugin.discovery.backends.aws import AwsF1Backend
from plugin.discovery.backends.intel import IntelBackend
from plugin.model.allocation import (
    ENV_DEVICES,
    ENV_UNITS,
    allocate,
    preferred_allocation,
)
from value_types.allocation import AllocationError
from value_types.devices import DeviceSet


def intel_devices(node: FakeNode) -> DeviceSet:
    return DeviceSet.of(IntelBackend(node.config()).scan())


def test_ports_get_their_nodes_and_both_variables_with_full_addresses(
    intel_node: FakeNode,
) -> None:
    result = allocate(intel_devices(intel_node), ["0000:be:00.2", "0000:3b:00.0-port1"])
    assert result.envs == {ENV_UNITS: "0000:be:00.2,0000:3b:00.0-port1",
                           ENV_DEVICES: "0000:be:00.2,0000:3b:00.0-port1"}
    assert [n.container_path for n in result.nodes] == ["/dev/intel-fpga-port.2",
                                                        "/dev/dfl-port.1"]
    assert all(n.permissions == "rw" for n in result.nodes)


def test_a_crashed_port_is_refused_with_its_reason(intel_node: FakeNode) -> None:
    intel_node.set_afu_id("intel-fpga-port.0", CRASHED_AFU_ID)
    with pytest.raises(AllocationError, match=r"0000:5e:00\.0 \(AFU ID is all f"):
        allocate(intel_devices(intel_node), ["0000:5e:00.0"])


def test_an_address_spelt_the_old_way_is_unknown(intel_node: FakeNode) -> None:
    with pytest.raises(AllocationError, match=r"unknown device IDs: 94:00\.0"):
        allocate(intel_devices(intel_node), ["94:00.0"])


def test_requests_are_packed_on_one_numa_node(intel_node: FakeNode) -> None:
    devices = intel_devices(intel_node)
    chosen = preferred_allocation(devices, list(devices.ids), [], 3)
    assert {devices.get(i).numa_node for i in chosen} == {0}  # type: ignore[union-attr]
    chosen = preferred_allocation(devices, list(devices.ids), ["0000:d8:00.0"], 3)
    assert {devices.get(i).numa_node for i in chosen} == {1}  # type: ignore[union-attr]


def test_f1_slots_are_packed_on_one_numa_node(f1_node: FakeNode) -> None:
    devices = DeviceSet.of(AwsF1Backend(f1_node.config()).scan())
    chosen = preferred_allocation(devices, list(devices.ids), ["0000:00:19.0"], 4)
    assert {devices.get(i).numa_node for i in chosen} == {1}  # type: ignore[union-attr]
    result = allocate(devices, chosen)
    assert result.envs[ENV_UNITS] == ",".join(chosen)
