"""Resource names and sockets per mode, as the kubelet and the pod author will see them."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plugin.model.resource_names import resource_name_problem
from plugin.model.resources import (
    afu_resource_name,
    group_by_resource,
    prefix_problem,
    socket_name_for,
)
from value_types.devices import Device, DeviceSet

NLB = "d8424dc4a4a3c413f89e433683f9040b"
DMA = "9e1f4ab2c6d3487a8b0e5f1a2c3d4e5f"


def port(bdf: str, afu_id: str | None) -> Device:
    attributes = (("afu_id", afu_id),) if afu_id is not None else ()
    return Device(id=bdf, backend="intel", attributes=attributes)


NODE = DeviceSet.of([
    port("0000:5e:00.0", NLB),
    port("0000:3b:00.0", DMA),
    port("0000:be:00.1", NLB),
    port("0000:d8:00.0", None),
])


def test_single_mode_is_one_resource_with_every_device() -> None:
    assert group_by_resource(NODE, "single", "b-com.com/accelerator", "b-com.com") == {
        "b-com.com/accelerator": NODE}


def test_single_mode_keeps_the_resource_when_empty() -> None:
    empty = DeviceSet.of(())
    assert group_by_resource(empty, "single", "b-com.com/accelerator", "x.io") == {
        "b-com.com/accelerator": empty}


def test_afu_mode_gives_each_afu_its_resource() -> None:
    groups = group_by_resource(NODE, "afu", "b-com.com/accelerator", "b-com.com")
    assert list(groups) == [f"b-com.com/afu-{DMA}", f"b-com.com/afu-{NLB}"]
    assert groups[f"b-com.com/afu-{NLB}"].ids == ("0000:5e:00.0", "0000:be:00.1")
    assert groups[f"b-com.com/afu-{DMA}"].ids == ("0000:3b:00.0",)
    assert all(resource_name_problem(name) is None for name in groups)


def test_afu_mode_leaves_out_ports_without_afu_or_with_a_crashed_one() -> None:
    devices = DeviceSet.of([port("0000:d8:00.0", None), port("0000:5e:00.0", "f" * 32)])
    assert group_by_resource(devices, "afu", "b-com.com/accelerator", "b-com.com") == {}


def test_afu_id_spellings_share_a_resource() -> None:
    devices = DeviceSet.of([
        port("0000:5e:00.0", NLB),
        port("0000:5f:00.0", "D8424DC4-A4A3-C413-F89E-433683F9040B"),
    ])
    groups = group_by_resource(devices, "afu", "", "fpga.example.com")
    assert list(groups) == [f"fpga.example.com/afu-{NLB}"]
    assert len(groups[f"fpga.example.com/afu-{NLB}"]) == 2


def test_grouping_is_deterministic() -> None:
    reversed_node = DeviceSet.of(reversed(list(NODE)))
    assert group_by_resource(NODE, "afu", "", "b-com.com") == group_by_resource(
        reversed_node, "afu", "", "b-com.com")


def test_a_bad_prefix_leaves_devices_out_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert group_by_resource(NODE, "afu", "", "Not A Domain") == {}
    assert "0000:5e:00.0" in caplog.text and "Not A Domain" in caplog.text
    assert prefix_problem("Not A Domain") is not None
    assert prefix_problem("kubernetes.io") is not None
    assert prefix_problem("b-com.com") is None


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="single, afu"):
        group_by_resource(NODE, "per-port", "", "b-com.com")


def test_long_afu_ids_get_distinct_valid_names() -> None:
    first = afu_resource_name("b-com.com", "a" * 64)
    second = afu_resource_name("b-com.com", "a" * 63 + "b")
    assert first != second
    assert resource_name_problem(first) is None and resource_name_problem(second) is None


@given(st.text(min_size=1, max_size=80))
def test_any_afu_id_gives_a_valid_name(afu_id: str) -> None:
    assert resource_name_problem(afu_resource_name("b-com.com", afu_id)) is None


def test_single_mode_socket_is_the_configured_one() -> None:
    assert socket_name_for("b-com.com/accelerator", "accelerator.sock", "single") == (
        "accelerator.sock")


def test_afu_mode_sockets_are_distinct_plain_file_names() -> None:
    groups = group_by_resource(NODE, "afu", "", "b-com.com")
    sockets = [socket_name_for(name, "accelerator.sock", "afu") for name in groups]
    assert sockets == [f"accelerator-afu-{DMA}.sock", f"accelerator-afu-{NLB}.sock"]
    assert all("/" not in s and s != "kubelet.sock" for s in sockets)
    assert socket_name_for(f"b-com.com/afu-{NLB}", "plugin", "afu") == f"plugin-afu-{NLB}.sock"
