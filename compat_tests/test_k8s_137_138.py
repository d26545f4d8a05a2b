"""The emulators' Kubernetes 1.37 and 1.38: the kubelet's health service pick, the API server's
served versions, locked gates and 1.37 schemas.

What each release does is cited where it is modelled (``kubelet/dra_models.py``,
``apiserver/models.py``, ``apiserver/openapi/1.37/README.md``); these tests hold the emulators
to it, with a fake DRA plugin over real sockets and the API server over real HTTP. The real
``serve`` against them is in ``test_dra_137_serve.py``.
"""

from __future__ import annotations

import asyncio
import copy

import pytest

from api_versions import dra_services
from compat_tests.apiserver import ApiServerEmulator, load_model, openapi_derive, schema, validate
from compat_tests.apiserver.client import ApiClient
from compat_tests.apiserver.openapi_derive import HERE, derive, dumps
from compat_tests.fake_dra_plugin import registered
from compat_tests.kubelet.dra_models import HEALTH_V1, HEALTH_V1ALPHA1, load_dra_model

DRIVER = "fpga.example.com"
V1_PATH = "/v1.DRAResourceHealth/NodeWatchResources"
V1ALPHA1_PATH = "/v1alpha1.DRAResourceHealth/NodeWatchResources"
PLUGIN_ONLY = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
BOTH = dra_services.SUPPORTED_VERSIONS
ALPHA_ONLY = (*PLUGIN_ONLY, HEALTH_V1ALPHA1)


# -- the kubelet's health service ----------------------------------------------------------------

@pytest.mark.parametrize(("model", "listed", "expected"), [
    ("1.34", BOTH, HEALTH_V1ALPHA1),
    ("1.36", BOTH, HEALTH_V1ALPHA1),
    ("1.36", PLUGIN_ONLY, HEALTH_V1ALPHA1),  # 1.34-1.36 call v1alpha1 listed or not
    ("1.37", BOTH, HEALTH_V1),
    ("1.37", (HEALTH_V1ALPHA1, HEALTH_V1, *PLUGIN_ONLY), HEALTH_V1),  # order does not matter
    ("1.37", ALPHA_ONLY, HEALTH_V1ALPHA1),
    ("1.37", PLUGIN_ONLY, None),  # 1.37+: no stream for a driver that lists none
    ("1.38", BOTH, HEALTH_V1),
    ("1.38", ALPHA_ONLY, HEALTH_V1ALPHA1),
    ("1.33", BOTH, None),
])
def test_each_release_picks_its_health_service(model, listed, expected):
    assert load_dra_model(model).health_service(listed) == expected


@pytest.mark.parametrize(("model", "listed", "path"), [
    ("1.36", BOTH, V1ALPHA1_PATH),
    ("1.37", BOTH, V1_PATH),
    ("1.37", ALPHA_ONLY, V1ALPHA1_PATH),
    ("1.38", BOTH, V1_PATH),
])
async def test_the_kubelet_streams_health_through_the_service_it_picked(dra_node, model, listed,
                                                                        path):
    kubelet = await dra_node(model)
    plugin = await dra_node.plugin(supported_versions=listed)
    await registered(kubelet, plugin)
    dra = kubelet.dra
    await dra.wait_until(lambda: plugin.health_streams == 1, what="a health stream")
    plugin.send_health({"device": {"pool_name": "node-1", "device_name": "fpga-0"},
                        "health": 2, "message": "over temperature"})
    await dra.wait_until(lambda: dra.health_updates, what="a health message")
    assert plugin.health_paths == [path]
    update = dra.health_updates[0]
    assert update.service == path.split("/")[1]
    assert [(d.device_name, d.health, d.message) for d in update.devices] == [
        ("fpga-0", "Unhealthy", "over temperature")]


async def test_a_1_37_kubelet_opens_no_health_stream_on_a_driver_listing_none(dra_node):
    kubelet = await dra_node("1.37")
    plugin = await dra_node.plugin(supported_versions=PLUGIN_ONLY)
    await registered(kubelet, plugin)
    await asyncio.sleep(0.5)  # more than two health retry periods of the fast config
    assert plugin.health_streams == 0 and kubelet.dra.health_attempts == []


async def test_a_1_36_kubelet_still_calls_v1alpha1_on_a_driver_listing_none(dra_node):
    kubelet = await dra_node("1.36")
    plugin = await dra_node.plugin(supported_versions=PLUGIN_ONLY)
    await registered(kubelet, plugin)
    await kubelet.dra.wait_until(lambda: plugin.health_streams == 1, what="a health stream")
    assert plugin.health_paths == [V1ALPHA1_PATH]


# -- the API server: served versions and gates ---------------------------------------------------

def test_1_37_serves_three_versions_and_1_38_drops_v1beta1():
    assert load_model("1.37").compiled == ("v1", "v1beta2", "v1beta1")
    assert load_model("1.38").compiled == ("v1", "v1beta2")
    assert load_model("1.38").served == ("v1",)
    assert load_model("1.37", "resource.k8s.io/v1beta1=true").served == ("v1", "v1beta1")
    assert load_model("1.38", "api/all=true").served == ("v1", "v1beta2")
    with pytest.raises(ValueError, match="unknown api group version"):
        load_model("1.38", "resource.k8s.io/v1beta1=true")


def test_ga_gates_of_1_37_are_on_and_locked_where_upstream_locks_them():
    m137, m138 = load_model("1.37"), load_model("1.38")
    for gate in ("DRADeviceTaints", "DRAExtendedResource", "DRAResourceClaimDeviceStatus"):
        assert m137.enabled(gate) and m138.enabled(gate)
    for gate in ("DRAExtendedResource", "DRAResourceClaimDeviceStatus"):
        with pytest.raises(ValueError, match=f"cannot set feature gate {gate} to false"):
            load_model("1.37", feature_gates=f"{gate}=false")
    assert not load_model("1.37", feature_gates="DRADeviceTaints=false").enabled(
        "DRADeviceTaints"), "GA but not locked before 1.38"
    with pytest.raises(ValueError, match="feature is locked to true"):
        load_model("1.38", feature_gates="DRADeviceTaints=false")
    assert load_model("1.36", feature_gates="DRAExtendedResource=false")
    with pytest.raises(ValueError, match="unrecognized feature gate: DynamicResourceAllocation"):
        load_model("1.38", feature_gates="DynamicResourceAllocation=true")
    assert load_model("1.37", feature_gates="DynamicResourceAllocation=true")


async def test_a_1_38_server_answers_404_for_v1beta1_and_lists_only_v1():
    async with ApiServerEmulator("1.38") as api, ApiClient(api.url, api.token,
                                                           api.ca_file) as client:
        group = await client.get("/apis/resource.k8s.io")
        assert [v["version"] for v in group.body["versions"]] == ["v1"]
        refused = await client.get("/apis/resource.k8s.io/v1beta1/resourceslices")
        assert refused.status == 404
        listed = await client.get("/apis/resource.k8s.io/v1/resourceslices")
        assert listed.status == 200 and listed.body["items"] == []


# -- the 1.37 schemas ----------------------------------------------------------------------------

def test_the_stored_1_37_schemas_are_what_the_recorded_derivation_makes():
    for name, document in derive().items():
        assert (HERE / "1.37" / name).read_text() == dumps(document), name


def test_1_37_v1_gains_device_taint_rules_and_nothing_else_changes():
    v136, v137 = schema.load("v1", "1.36"), schema.load("v1", "1.37")
    added = set(v137) - set(v136)
    assert added == {f"io.k8s.api.resource.v1.{t}" for t in openapi_derive.TAINT_RULE_TYPES}
    assert all(v137[name] == v136[name] for name in v136)
    assert v137["io.k8s.api.resource.v1.DeviceTaintSelector"]["properties"].keys() == {
        "device", "driver", "pool"}
    for version in ("v1beta1", "v1beta2"):
        assert schema.load(version, "1.37") == schema.load(version, "1.36")


@pytest.mark.parametrize(("model", "release"), [
    ("1.32", "1.36"), ("1.36", "1.36"), ("1.37", "1.37"), ("1.38", "1.37")])
def test_each_model_reads_its_schema_set(model, release):
    assert load_model(model).schema_release == release


def _slice(version: str = "v1", **device_extra: object) -> dict:
    return {
        "apiVersion": f"resource.k8s.io/{version}", "kind": "ResourceSlice",
        "metadata": {"generateName": "node-a-accelerator.b-com.com-"},
        "spec": {"driver": "accelerator.b-com.com", "nodeName": "node-a",
                 "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "pci-0000-3b-00-0", "attributes": {
                     "resource.kubernetes.io/numaNode": {"int": 1},
                     "resource.kubernetes.io/pciBusID": {"string": "0000:3b:00.0"},
                     "family": {"string": "intel"}}, **device_extra}]},
    }


@pytest.mark.parametrize("model", ["1.37", "1.38"])
def test_a_slice_with_the_standard_numa_attribute_is_valid_in_1_37_schemas(model):
    assert validate(_slice(), model=model) == []
    bad = copy.deepcopy(_slice())
    bad["spec"]["devices"][0]["attributes"]["resource.kubernetes.io/numaNode"] = {"int": "1"}
    assert any("cannot unmarshal string" in p for p in validate(bad, model=model))
    assert any('unknown field "spec.devices[0].numaNode"' in p
               for p in validate(_slice(numaNode=1), model=model))


def test_v1beta1_is_no_version_a_1_38_server_validates():
    assert validate(_slice("v1beta1"), model="1.38") == [
        "resource.k8s.io/v1beta1 is not served by a 1.38 API server"]
