"""Allocate and preferred-allocation decisions, as every generation's kubelet will see them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugin.model.allocation import (
    ENV_DEVICES,
    ENV_UNITS,
    allocate,
    preferred_allocation,
)
from value_types.allocation import AllocationError
from value_types.devices import Device, DeviceNode, DeviceSet, Health


def units(n: int) -> DeviceSet:
    return DeviceSet.of(Device(id=str(i), backend="units") for i in range(n))


def port(bdf: str, numa: int | None, healthy: bool = True) -> Device:
    return Device(
        id=bdf,
        backend="intel",
        numa_node=numa,
        health=Health.HEALTHY if healthy else Health.UNHEALTHY,
        health_reason="" if healthy else "AFU ID is all f",
        nodes=(DeviceNode(f"/dev/intel-fpga-port.{bdf[-1]}", f"/dev/intel-fpga-port.{bdf[-1]}"),),
    )


def test_units_env_lists_ids_in_request_order() -> None:
    result = allocate(units(40), ["12", "3", "0"])
    assert result.envs == {ENV_UNITS: "12,3,0"}
    assert result.device_ids == ("12", "3", "0")
    assert result.nodes == ()


def test_pci_devices_get_both_variables_and_their_nodes() -> None:
    devices = DeviceSet.of([port("0000:5e:00.1", 0), port("0000:5e:00.2", 0)])
    result = allocate(devices, ["0000:5e:00.2"])
    assert result.envs == {ENV_UNITS: "0000:5e:00.2", ENV_DEVICES: "0000:5e:00.2"}
    assert [n.host_path for n in result.nodes] == ["/dev/intel-fpga-port.2"]
    assert result.nodes[0].permissions == "rw"


@pytest.mark.parametrize(
    ("request_ids", "expected_words"),
    [
        (["7"], ["unknown device IDs: 7", "0..3"]),
        (["1", "1"], ["more than once: 1"]),
        ([], ["no device IDs requested"]),
        (["2", "x", "x"], ["more than once: x", "unknown device IDs: x"]),
    ],
)
def test_bad_requests_are_refused_whole_with_every_id_named(request_ids, expected_words) -> None:
    with pytest.raises(AllocationError) as refused:
        allocate(units(4), request_ids)
    for words in expected_words:
        assert words in str(refused.value)


def test_unhealthy_device_is_refused_with_its_reason() -> None:
    devices = DeviceSet.of([port("0000:5e:00.1", 0), port("0000:5e:00.2", 0, healthy=False)])
    with pytest.raises(AllocationError, match=r"unhealthy device IDs: 0000:5e:00.2 \(AFU ID"):
        allocate(devices, ["0000:5e:00.1", "0000:5e:00.2"])


def numa_node_set() -> DeviceSet:
    # NUMA 0: 00.0-00.2 (3 devices), NUMA 1: 80.0-80.4 (5 devices), no NUMA: ff.0
    return DeviceSet.of(
        [port(f"0000:00:00.{i}", 0) for i in range(3)]
        + [port(f"0000:80:00.{i}", 1) for i in range(5)]
        + [port("0000:ff:00.0", None)]
    )


def test_preferred_allocation_packs_one_numa_node_choosing_the_smallest_that_fits() -> None:
    devices = numa_node_set()
    chosen = preferred_allocation(devices, list(devices.ids), [], 2)
    assert chosen == ["0000:00:00.0", "0000:00:00.1"]
    chosen = preferred_allocation(devices, list(devices.ids), [], 4)
    assert chosen == [f"0000:80:00.{i}" for i in range(4)]


def test_preferred_allocation_keeps_must_include_and_follows_its_numa_node() -> None:
    devices = numa_node_set()
    chosen = preferred_allocation(devices, list(devices.ids), ["0000:80:00.3"], 3)
    assert chosen[0] == "0000:80:00.3"
    assert chosen[1:] == ["0000:80:00.0", "0000:80:00.1"]


def test_preferred_allocation_spans_largest_nodes_first_when_none_fits() -> None:
    devices = numa_node_set()
    chosen = preferred_allocation(devices, list(devices.ids), [], 7)
    assert chosen[:5] == [f"0000:80:00.{i}" for i in range(5)]
    assert chosen[5:] == ["0000:00:00.0", "0000:00:00.1"]


def test_preferred_allocation_skips_unhealthy_and_unknown_and_is_deterministic() -> None:
    devices = DeviceSet.of([port("0000:00:00.0", 0, healthy=False), port("0000:00:00.1", 0),
                            port("0000:00:00.2", 0)])
    available = ["0000:00:00.2", "0000:00:00.0", "nope", "0000:00:00.1"]
    first = preferred_allocation(devices, available, [], 2)
    assert first == ["0000:00:00.1", "0000:00:00.2"]
    assert all(preferred_allocation(devices, available, [], 2) == first for _ in range(5))


def test_a_refusal_names_a_few_offenders_and_counts_the_rest() -> None:
    with pytest.raises(AllocationError) as refused:
        allocate(units(4), [f"bogus-{i}" for i in range(10_000)])
    message = str(refused.value)
    assert len(message) < 1024
    assert "bogus-0, bogus-1, bogus-2, bogus-3, bogus-4, and 9,995 more" in message


def test_a_huge_id_is_cut_in_the_refusal() -> None:
    with pytest.raises(AllocationError) as refused:
        allocate(units(4), ["x" * (1 << 20), "1", "1"])
    message = str(refused.value)
    assert len(message) < 1024
    assert "(1,048,576 characters)" in message and "more than once: 1" in message


def test_preferred_allocation_never_vouches_for_what_is_not_available_and_owned() -> None:
    devices = DeviceSet.of([port("0000:00:00.0", 0), port("0000:00:00.1", 0),
                            port("0000:00:00.2", 0, healthy=False)])
    available = ["0000:00:00.0", "0000:00:00.1", "0000:00:00.2"]
    assert preferred_allocation(devices, available, ["not-ours"], 1) == ["0000:00:00.0"]
    assert preferred_allocation(devices, available, ["0000:00:00.2"], 1) == ["0000:00:00.0"]
    assert preferred_allocation(devices, ["0000:00:00.1"], ["0000:00:00.0"], 1) == [
        "0000:00:00.1"]
    assert preferred_allocation(devices, available, ["0000:00:00.1"], -3) == []
    assert preferred_allocation(devices, available, [], 0) == []
    assert preferred_allocation(devices, available, available, 1) == ["0000:00:00.0"]


ids = st.sampled_from([f"0000:00:00.{i}" for i in range(8)] + ["1", "x", "", "\n"])


@settings(max_examples=300, deadline=None)
@given(
    owned=st.lists(st.tuples(st.integers(0, 7), st.sampled_from([None, 0, 1]), st.booleans()),
                   max_size=8, unique_by=lambda t: t[0]),
    available=st.lists(ids, max_size=12),
    must_include=st.lists(ids, max_size=6),
    size=st.integers(-5, 12),
)
def test_preferred_allocation_properties(owned, available, must_include, size) -> None:
    devices = DeviceSet.of(port(f"0000:00:00.{i}", numa, healthy) for i, numa, healthy in owned)
    usable = {i for i in available if (d := devices.get(i)) is not None and d.healthy}
    chosen = preferred_allocation(devices, available, must_include, size)
    assert set(chosen) <= usable, "only available, owned, healthy IDs"
    assert len(chosen) == len(set(chosen)), "no duplicates"
    assert len(chosen) == min(max(size, 0), len(usable)), "as many as asked, if there are"
    wanted = [i for i in dict.fromkeys(must_include) if i in usable][: max(size, 0)]
    assert chosen[: len(wanted)] == wanted, "valid must-include IDs first, in order"
