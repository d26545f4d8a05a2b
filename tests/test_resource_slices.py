"""ResourceSlices as an API server takes them, for v1, v1beta2 and v1beta1 on every release.

Every slice built here goes through ``compat_tests.apiserver``: ``validate`` (the server's own
rejection messages, strict about unknown fields) and the write path itself, to see what the
server stores, which is what the scheduler will allocate from.
"""

from __future__ import annotations

from typing import Any

import pytest

from api_versions.resource_slices import (
    MAX_DEVICES,
    MAX_DEVICES_WITH_TAINTS,
    device_shape,
    dropped_taints,
    slices_for,
    taint_key,
)
from compat_tests.apiserver import MODELS, load_model, validate
from compat_tests.apiserver.pipeline import decode_write, encode_read
from compat_tests.fake_alveo import build_mixed_node
from compat_tests.fake_sysfs import build_broken_node
from plugin.discovery.backends import make_backend
from plugin.discovery.backends.units import UnitsBackend
from plugin.serving.dra.inventory import pool_of
from value_types.devices import Device, DeviceSet, Health
from value_types.pool import Pool

DRIVER = "fpga.b-com.com"
NODE = "worker-1"
UID = "6f1c2a9e-1d0b-4c47-9d8e-2b7f0e5a3c11"
VERSIONS = ("v1", "v1beta2", "v1beta1")
SERVED = [(v, m) for m in MODELS for v in VERSIONS if v in load_model(m).compiled]
"""Every (version, release) pair a server can be configured to serve."""
WITH_TAINTS = [(v, m) for v, m in SERVED if int(m.split(".")[1]) >= 33]
"""Releases whose schemas know device taints (KEP-5055, 1.33)."""


def pool_from(devices: list[Device]) -> Pool:
    return pool_of(DRIVER, NODE, DeviceSet.of(devices))


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Pool:
    node = build_mixed_node(tmp_path_factory.mktemp("mixed"))
    return pool_from(make_backend("auto", node.config()).scan())


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory) -> Pool:
    node = build_broken_node(tmp_path_factory.mktemp("broken"))
    return pool_from(make_backend("intel", node.config()).scan())


def units(count: int, unhealthy: tuple[int, ...] = ()) -> Pool:
    return pool_from([
        Device(id=str(i), backend="units",
               health=Health.UNHEALTHY if i in unhealthy else Health.HEALTHY,
               health_reason="AFU ID is all f: firmware crashed" if i in unhealthy else "")
        for i in range(count)])


def stored(obj: dict[str, Any], model: str, gates: dict[str, bool] | None = None,
           ) -> dict[str, Any]:
    """What a ``model`` server keeps of a created ``obj``, read back in the version it was sent."""
    from compat_tests.apiserver import strategy

    version = obj["apiVersion"].split("/")[1]
    server = load_model(model, {f"resource.k8s.io/{version}": True}, gates)
    hub, _ = decode_write("resourceslices", version, obj, server, "Strict")
    strategy.prepare_create("resourceslices", hub, server)
    return encode_read("resourceslices", version, hub, server)


def names_in(slices: list[dict[str, Any]]) -> list[str]:
    return [d["name"] for s in slices for d in s["spec"]["devices"]]


def fields(version: str, device: dict[str, Any]) -> dict[str, Any]:
    return device["basic"] if version == "v1beta1" else device


# Every slice passes the server --------------------------------------------------------------

@pytest.mark.parametrize(("version", "model"), SERVED)
def test_slices_without_taints_pass_every_server(version: str, model: str, mixed: Pool,
                                                 broken: Pool) -> None:
    for pool in (mixed, broken, units(40), pool_from([])):
        for obj in slices_for(version, pool, 3, UID, taints=False):
            assert validate(obj, model=model, schema_required=True) == [], (pool.name, obj)


@pytest.mark.parametrize(("version", "model"), WITH_TAINTS)
def test_slices_with_taints_pass_every_server_that_knows_them(version: str, model: str,
                                                              broken: Pool) -> None:
    for gates in (None, {"DRADeviceTaints": True}):
        for obj in slices_for(version, broken, 0, UID, taints=True):
            assert validate(obj, model=model, schema_required=True, feature_gates=gates) == []


def test_a_1_32_server_does_not_know_taints_at_all(broken: Pool) -> None:
    [obj] = slices_for("v1beta1", broken, 0, UID, taints=True)
    [problem] = validate(obj, model="1.32")
    assert 'unknown field "spec.devices[1].basic.taints"' in problem


def test_the_versions_mean_the_same_slice_to_the_server(mixed: Pool, broken: Pool) -> None:
    server = load_model("1.36", "resource.k8s.io/v1beta2=true,resource.k8s.io/v1beta1=true")
    for pool in (mixed, broken):
        hubs = []
        for version in VERSIONS:
            [obj] = slices_for(version, pool, 1, UID, taints=True)
            hub, _ = decode_write("resourceslices", version, obj, server, "Strict")
            hubs.append({k: v for k, v in hub.items() if k != "apiVersion"})
        assert hubs[0] == hubs[1] == hubs[2]


# What is published ---------------------------------------------------------------------------

@pytest.mark.parametrize("version", VERSIONS)
def test_slice_shape(version: str, mixed: Pool) -> None:
    [obj] = slices_for(version, mixed, 7, UID, taints=False)
    assert obj["apiVersion"] == f"resource.k8s.io/{version}"
    assert obj["kind"] == "ResourceSlice"
    assert obj["metadata"] == {
        "generateName": "worker-1-fpga.b-com.com-",
        "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": UID,
                             "controller": True}],
    }
    spec = obj["spec"]
    assert (spec["driver"], spec["nodeName"]) == (DRIVER, NODE)
    assert spec["pool"] == {"name": NODE, "generation": 7, "resourceSliceCount": 1}
    assert names_in([obj]) == [d.name for d in mixed.devices]
    intel = fields(version, spec["devices"][3])
    assert spec["devices"][3]["name"] == "pci-0000-5e-00-0"
    assert intel["attributes"]["afuID"] == {"string": "d8424dc4a4a3c413f89e433683f9040b"}
    assert intel["attributes"]["resource.kubernetes.io/numaNode"] == {"int": 0}
    assert "taints" not in intel and "capacity" not in intel
    wrapped = version == "v1beta1"
    assert all(("basic" in d) == wrapped and ("attributes" in d) != wrapped
               for d in spec["devices"])


@pytest.mark.parametrize("version", VERSIONS)
def test_unhealthy_devices_are_left_out_when_taints_are_not_kept(version: str,
                                                                 broken: Pool) -> None:
    [obj] = slices_for(version, broken, 0, UID, taints=False)
    assert names_in([obj]) == ["pci-0000-12-00-0", "pci-0000-d8-00-0"]


@pytest.mark.parametrize("version", VERSIONS)
def test_unhealthy_devices_are_tainted_when_taints_are_kept(version: str, broken: Pool) -> None:
    [obj] = slices_for(version, broken, 0, UID, taints=True)
    taints = {d["name"]: fields(version, d).get("taints") for d in obj["spec"]["devices"]}
    assert taints["pci-0000-12-00-0"] is None
    assert taints["pci-0000-3b-00-0"] == [
        {"key": "fpga.b-com.com/unhealthy", "value": "afu-crashed", "effect": "NoSchedule"}]
    assert taints["pci-0000-5e-00-0"][0]["value"] == "port-error"
    assert sum(1 for t in taints.values() if t) == 4


@pytest.mark.parametrize("version", ["v1", "v1beta2", "v1beta1"])
def test_a_server_with_the_gate_keeps_the_taint(version: str, broken: Pool) -> None:
    [sent] = slices_for(version, broken, 0, UID, taints=True)
    for model, gates in (("1.36", None), ("1.34", {"DRADeviceTaints": True})):
        kept = stored(sent, model, gates)
        assert not dropped_taints(version, sent, kept)
        device = next(d for d in kept["spec"]["devices"] if d["name"] == "pci-0000-3b-00-0")
        [taint] = fields(version, device)["taints"]
        assert (taint["key"], taint["effect"]) == (taint_key(DRIVER), "NoSchedule")
        assert "timeAdded" in taint  # the server's default


@pytest.mark.parametrize("model", ["1.33", "1.34", "1.35"])
def test_a_server_without_the_gate_would_offer_a_broken_device(model: str,
                                                               broken: Pool) -> None:
    """Why the caller must say: a gate-off server drops taints silently and stores the
    unhealthy device as allocatable. ``dropped_taints`` sees it; without taints the device is
    not there to be allocated."""
    [sent] = slices_for("v1beta2", broken, 0, UID, taints=True)
    kept = stored(sent, model)
    assert dropped_taints("v1beta2", sent, kept)
    assert "pci-0000-3b-00-0" in names_in([kept])
    [safe] = slices_for("v1beta2", broken, 0, UID, taints=False)
    assert "pci-0000-3b-00-0" not in names_in([stored(safe, model)])
    assert not dropped_taints("v1beta2", safe, stored(safe, model))


def test_an_empty_pool_is_one_empty_slice() -> None:
    for taints in (False, True):
        [obj] = slices_for("v1", pool_from([]), 2, UID, taints=taints)
        assert obj["spec"]["devices"] == []
        assert obj["spec"]["pool"]["resourceSliceCount"] == 1
    [obj] = slices_for("v1", units(3, unhealthy=(0, 1, 2)), 0, UID, taints=False)
    assert obj["spec"]["devices"] == []


# Splitting -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("count", "taints", "sizes"), [
    (MAX_DEVICES, False, [128]),
    (MAX_DEVICES + 1, False, [128, 1]),
    (300, False, [128, 128, 44]),
    (MAX_DEVICES_WITH_TAINTS, True, [64]),
    (300, True, [64, 64, 64, 64, 44]),
])
def test_a_big_pool_is_split_at_the_device_limit(count: int, taints: bool,
                                                 sizes: list[int]) -> None:
    pool = units(count, unhealthy=(5, count - 1) if taints else ())
    for version in VERSIONS:
        slices = slices_for(version, pool, 4, UID, taints=taints)
        assert [len(s["spec"]["devices"]) for s in slices] == sizes
        assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {len(sizes)}
        assert {s["spec"]["pool"]["generation"] for s in slices} == {4}
        assert names_in(slices) == [d.name for d in pool.devices]  # each once, in order
        for obj in slices:
            assert validate(obj, model="1.36") == []


def test_the_layout_does_not_move_when_a_device_turns_unhealthy() -> None:
    healthy = slices_for("v1", units(150), 1, UID, taints=True)
    sick = slices_for("v1", units(150, unhealthy=(3,)), 2, UID, taints=True)
    assert [names_in([s]) for s in healthy] == [names_in([s]) for s in sick]


def test_the_taint_limit_is_real() -> None:
    """One tainted device in a slice of 65 and the server refuses the whole slice: why
    slices are cut at 64 whenever taints are kept."""
    pool = units(65, unhealthy=(0,))
    [obj] = slices_for("v1", pool, 0, UID, taints=False)
    obj["spec"]["devices"] = [device_shape("v1", d, DRIVER) for d in pool.devices]
    [problem] = validate(obj, model="1.36")
    assert "spec.devices: Too many: 65: must have at most 64 items" in problem


def test_existing_slices_keep_their_names() -> None:
    slices = slices_for("v1", units(200), 5, UID, taints=False, names=["worker-1-fpga-abcde"])
    assert slices[0]["metadata"]["name"] == "worker-1-fpga-abcde"
    assert "generateName" not in slices[0]["metadata"]
    assert slices[1]["metadata"]["generateName"] == "worker-1-fpga.b-com.com-"
    assert all(validate(s, model="1.36") == [] for s in slices)


def test_a_long_node_name_still_gives_a_valid_prefix() -> None:
    node = ".".join(["n" * 60] * 4)
    pool = pool_of(DRIVER, node, DeviceSet.of(UnitsBackend(2).scan()))
    [obj] = slices_for("v1", pool, 0, UID, taints=False)
    assert len(obj["metadata"]["generateName"]) == 58
    assert validate(obj, model="1.36") == []


@pytest.mark.parametrize(("args", "message"), [
    (("v1alpha3", 0, UID), "v1alpha3"),
    (("v2", 0, UID), "v2"),
    (("v1", -1, UID), "generation"),
    (("v1", True, UID), "generation"),
    (("v1", 0, ""), "UID"),
])
def test_refused_arguments(args: tuple[str, int, str], message: str) -> None:
    version, generation, uid = args
    with pytest.raises(ValueError, match=message):
        slices_for(version, units(1), generation, uid, taints=False)


def test_dropped_taints_reads_each_versions_layout() -> None:
    pool = units(2, unhealthy=(1,))
    for version in VERSIONS:
        [sent] = slices_for(version, pool, 0, UID, taints=True)
        assert not dropped_taints(version, sent, sent)
        bare = slices_for(version, pool, 0, UID, taints=True)[0]
        for device in bare["spec"]["devices"]:
            fields(version, device).pop("taints", None)
        assert dropped_taints(version, sent, bare)


@pytest.mark.parametrize(("version", "model"), WITH_TAINTS)
def test_a_device_held_through_the_device_plugin_is_tainted_in_use(version: str,
                                                                   model: str) -> None:
    """Held and unhealthy at once: both taints, and the schema of every release that knows
    taints accepts them; without taints the held device is left out."""
    devices = DeviceSet.of([
        Device(id="0", backend="units"), Device(id="1", backend="units"),
        Device(id="2", backend="units", health=Health.UNHEALTHY,
               health_reason="AFU ID is all f: firmware crashed")])
    pool = pool_of(DRIVER, NODE, devices, held={"1": "device-plugin", "2": "device-plugin"})
    [obj] = slices_for(version, pool, 0, UID, taints=True)
    assert validate(obj, model=model, schema_required=True,
                    feature_gates={"DRADeviceTaints": True}) == []
    taints = {d["name"]: fields(version, d).get("taints") for d in obj["spec"]["devices"]}
    in_use = {"key": "fpga.b-com.com/in-use", "value": "device-plugin", "effect": "NoSchedule"}
    assert taints["unit-0"] is None and taints["unit-1"] == [in_use]
    assert [t["key"] for t in taints["unit-2"]] == ["fpga.b-com.com/unhealthy",
                                                    "fpga.b-com.com/in-use"]
    [bare] = slices_for(version, pool, 0, UID, taints=False)
    assert names_in([bare]) == ["unit-0"]
