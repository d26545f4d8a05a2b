"""The emulator stores, converts and checks resource.k8s.io objects as a real API server does.

Each test states a server behaviour a DRA driver depends on (read upstream, cited in the
emulator's modules) and checks it from the client's side of the wire where it can.
"""

from __future__ import annotations

import copy

import pytest

from compat_tests.apiserver import load_model, quantity, validate
from compat_tests.apiserver import objects as o
from compat_tests.apiserver.client import path

DRIVER = "fpga.example.com"
SLICES = path("resourceslices")


def a_slice(name="node-a-fpga", node="node-a", devices=None, **kw):
    devices = devices if devices is not None else [
        o.device("fpga-0", {"model": "u250", "cores": 4, f"{DRIVER}/healthy": True},
                 {"memory": "1024Mi"})]
    return o.resource_slice(name, driver=DRIVER, node_name=node, devices=devices, **kw)


def to_v1beta1(obj):
    out = copy.deepcopy(obj)
    out["apiVersion"] = "resource.k8s.io/v1beta1"
    for device in out["spec"].get("devices", []):
        device["basic"] = {k: device.pop(k) for k in list(device) if k != "name"}
    return out


# --- conversion ---------------------------------------------------------------------------


async def test_slice_written_as_v1beta1_reads_as_v1_and_back(client):
    written = to_v1beta1(a_slice())
    created = await client.create(path("resourceslices", "v1beta1"), written)
    assert created.status == 201, created.body
    as_v1 = (await client.get(path("resourceslices", "v1", "node-a-fpga"))).body
    device = as_v1["spec"]["devices"][0]
    assert "basic" not in device
    assert device["attributes"]["model"] == {"string": "u250"}
    assert device["capacity"]["memory"] == {"value": "1Gi"}  # canonical quantity
    as_v1beta2 = (await client.get(path("resourceslices", "v1beta2", "node-a-fpga"))).body
    assert as_v1beta2["spec"] == as_v1["spec"]
    back = (await client.get(path("resourceslices", "v1beta1", "node-a-fpga"))).body
    assert back["apiVersion"] == "resource.k8s.io/v1beta1"
    assert back["spec"]["devices"][0]["basic"]["attributes"] == written["spec"]["devices"][0][
        "basic"]["attributes"]
    assert back["metadata"]["uid"] == as_v1["metadata"]["uid"]


async def test_slice_written_as_v1_reads_as_v1beta1_with_basic(client):
    slice_ = a_slice(devices=[o.device("fpga-0"), o.device("fpga-1", {"cores": 2})])
    assert (await client.create(SLICES, slice_)).status == 201
    old = (await client.get(path("resourceslices", "v1beta1", "node-a-fpga"))).body
    assert old["spec"]["devices"] == [
        {"name": "fpga-0", "basic": {}},
        {"name": "fpga-1", "basic": {"attributes": {"cores": {"int": 2}}}}]


async def test_claim_request_moves_between_flat_and_exactly(client):
    claim = {"apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceClaim",
             "metadata": {"name": "c1"},
             "spec": {"devices": {"requests": [{"name": "fpga", "deviceClassName": "fpga"}]}}}
    reply = await client.create(path("resourceclaims", "v1beta1", namespace="default"), claim)
    assert reply.status == 201, reply.body
    # v1beta1 defaulting applies too: allocationMode ExactCount, count 1.
    assert reply.body["spec"]["devices"]["requests"][0] == {
        "name": "fpga", "deviceClassName": "fpga", "allocationMode": "ExactCount", "count": 1}
    as_v1 = (await client.get(path("resourceclaims", "v1", "c1", "default"))).body
    assert as_v1["spec"]["devices"]["requests"][0] == {
        "name": "fpga",
        "exactly": {"deviceClassName": "fpga", "allocationMode": "ExactCount", "count": 1}}


async def test_v1beta1_empty_node_name_means_unset(client):
    written = to_v1beta1(a_slice())
    written["spec"]["nodeName"] = ""
    reply = await client.create(path("resourceslices", "v1beta1"), written)
    assert reply.status == 422
    assert "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` " \
        "is required" in reply.message
    written = a_slice()
    written["spec"]["nodeName"] = ""
    reply = await client.create(SLICES, written)
    assert reply.status == 422
    assert 'spec.nodeName: Invalid value: "": must be either unset or set to a non-empty string' \
        in reply.message


# --- schema and validation ----------------------------------------------------------------


async def test_unknown_field_is_400_with_strict_and_a_warning_with_warn(client):
    slice_ = a_slice()
    slice_["spec"]["devices"][0]["colour"] = "blue"
    strict = await client.create(SLICES, slice_, fieldValidation="Strict")
    assert strict.status == 400
    assert strict.reason == "BadRequest"
    assert strict.message == ('ResourceSlice in version "v1" cannot be handled as a ResourceSlice:'
                              ' strict decoding error: unknown field "spec.devices[0].colour"')
    warned = await client.create(SLICES, slice_, fieldValidation="Warn")
    assert warned.status == 201
    assert warned.warnings == ['299 - "unknown field \\"spec.devices[0].colour\\""']
    assert "colour" not in warned.body["spec"]["devices"][0]


async def test_bad_device_name_is_422_naming_the_field(client):
    reply = await client.create(SLICES, a_slice(devices=[o.device("0000:3b:00.0")]))
    assert reply.status == 422
    assert reply.reason == "Invalid"
    cause = reply.body["details"]["causes"][0]
    assert cause["field"] == "spec.devices[0].name"
    assert cause["reason"] == "FieldValueInvalid"
    assert reply.message.startswith('ResourceSlice.resource.k8s.io "node-a-fpga" is invalid: '
                                    'spec.devices[0].name: Invalid value: "0000:3b:00.0": a '
                                    "lowercase RFC 1123 label")
    assert reply.body["details"]["kind"] == "ResourceSlice"


async def test_wrong_json_type_is_400(client):
    slice_ = a_slice()
    slice_["spec"]["pool"]["generation"] = "1"
    reply = await client.create(SLICES, slice_)
    assert reply.status == 400
    assert "cannot unmarshal string into Go struct field ResourcePool.spec.pool.generation of " \
        "type int64" in reply.message


@pytest.mark.parametrize(("change", "expected"), [
    (lambda s: s["spec"]["devices"][0]["attributes"].update(x={"int": 1, "bool": True}),
     'spec.devices[0].attributes[x]: Invalid value: {"bool":true,"int":1}: exactly one value '
     "must be specified"),
    (lambda s: s["spec"]["devices"][0]["attributes"].update(x={}),
     'spec.devices[0].attributes[x]: Invalid value: "": exactly one value must be specified'),
    (lambda s: s["spec"]["devices"][0]["attributes"].update({"bad name": {"int": 1}}),
     'spec.devices[0].attributes: Invalid value: "bad name": a valid C identifier'),
    (lambda s: s["spec"]["devices"][0]["attributes"].update(v={"version": "1.0"}),
     'spec.devices[0].attributes[v].version: Invalid value: "1.0": must be a string compatible '
     "with semver.org spec 2.0.0"),
    (lambda s: s["spec"].update(allNodes=True),
     'spec: Invalid value: "{`nodeName`, `allNodes`}": exactly one of `nodeName`, '
     "`nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required, but multiple fields "
     "are set"),
    (lambda s: s["spec"]["pool"].update(resourceSliceCount=0),
     "spec.pool.resourceSliceCount: Invalid value: 0: must be greater than zero"),
    (lambda s: s["spec"].update(driver="FPGA_driver"),
     'spec.driver: Invalid value: "FPGA_driver": a lowercase RFC 1123 subdomain'),
    (lambda s: s["spec"].update(devices=[o.device(f"d{i}") for i in range(129)]),
     "spec.devices: Too many: 129: must have at most 128 items"),
    (lambda s: s["spec"].update(devices=[o.device(f"d{i}") for i in range(64)] + [
        o.device("t", taints=[{"key": "k", "effect": "NoSchedule"}])]),
     "spec.devices: Too many: 65: must have at most 64 items"),
    (lambda s: s["spec"]["devices"][0].update(taints=[{"key": "k", "effect": "Evict"}]),
     'spec.devices[0].taints[0].effect: Unsupported value: "Evict": supported values: '
     '"NoExecute", "NoSchedule", "None"'),
    (lambda s: s["spec"].update(devices=[o.device("a"), o.device("a")]),
     'spec.devices[1]: Duplicate value: "a"'),
])
def test_validate_reports_the_servers_own_message(change, expected):
    slice_ = a_slice()
    assert validate(slice_) == []
    change(slice_)
    problems = validate(slice_)
    assert any(p.startswith(expected) for p in problems), problems


def test_validate_checks_every_served_version_and_claims_and_classes():
    assert validate(to_v1beta1(a_slice())) == []
    assert validate(o.claim("default", "c")) == []
    assert validate(o.device_class("fpga", driver=DRIVER)) == []
    claim = o.claim("default", "c")
    claim["spec"]["devices"]["requests"][0]["exactly"]["count"] = 2
    claim["spec"]["devices"]["requests"][0]["exactly"]["allocationMode"] = "All"
    assert validate(claim) == ["spec.devices.requests[0].exactly.count: Invalid value: 2: must "
                               "not be specified when allocationMode is 'All'"]
    bad_class = o.device_class("fpga", extended_resource_name="fpga")
    assert validate(bad_class) == ['spec.extendedResourceName: Invalid value: "fpga": must be a '
                                   "valid extended resource name"]
    unknown = a_slice()
    unknown["spec"]["unknown"] = 1
    assert validate(unknown) == ['ResourceSlice in version "v1" cannot be handled as a '
                                 'ResourceSlice: strict decoding error: unknown field '
                                 '"spec.unknown"']


def test_validate_can_also_report_schema_required_fields():
    slice_ = a_slice()
    del slice_["spec"]["pool"]["generation"]
    assert validate(slice_) == []  # the server defaults it to 0
    assert validate(slice_, schema_required=True) == [
        "spec.pool.generation: Required value (schema)"]


# --- feature gates and releases -----------------------------------------------------------


TAINTED = [o.device("fpga-0", taints=[{"key": f"{DRIVER}/unhealthy", "effect": "NoExecute"}])]


async def test_taints_are_dropped_silently_with_the_gate_off(start_api):
    _, client = await start_api("1.35")  # DRADeviceTaints alpha, off
    reply = await client.create(SLICES, a_slice(devices=TAINTED))
    assert reply.status == 201
    assert reply.warnings == []
    assert "taints" not in reply.body["spec"]["devices"][0]


async def test_taints_are_kept_with_the_gate_on(start_api):
    _, client = await start_api("1.35", feature_gates="DRADeviceTaints=true")
    reply = await client.create(SLICES, a_slice(devices=TAINTED))
    taint = reply.body["spec"]["devices"][0]["taints"][0]
    assert taint["effect"] == "NoExecute"
    assert "timeAdded" in taint  # defaulted by the server
    _, on_136 = await start_api("1.36")
    assert "taints" in (await on_136.create(SLICES, a_slice(devices=TAINTED))).body["spec"][
        "devices"][0]


async def test_a_release_without_the_field_rejects_it_as_unknown(start_api):
    _, client = await start_api("1.32", runtime_config="resource.k8s.io/v1beta1=true")
    written = to_v1beta1(a_slice(devices=TAINTED))
    reply = await client.create(path("resourceslices", "v1beta1"), written)
    assert reply.status == 400
    assert 'unknown field "spec.devices[0].basic.taints"' in reply.message


async def test_taint_effect_none_exists_from_136(start_api):
    none_taint = [o.device("d", taints=[{"key": "k", "effect": "None"}])]
    _, old = await start_api("1.35", feature_gates="DRADeviceTaints=true")
    assert (await old.create(SLICES, a_slice(devices=none_taint))).status == 422
    _, new = await start_api("1.36")
    assert (await new.create(SLICES, a_slice(devices=none_taint))).status == 201


async def test_extended_resource_name_is_dropped_with_the_gate_off(start_api):
    classes = path("deviceclasses")
    body = o.device_class("fpga", driver=DRIVER, extended_resource_name="example.com/fpga")
    _, client_135 = await start_api("1.35")
    assert "extendedResourceName" not in (await client_135.create(classes, body)).body["spec"]
    _, client_136 = await start_api("1.36")
    assert (await client_136.create(classes, body)).body["spec"]["extendedResourceName"] == \
        "example.com/fpga"


def test_models_say_what_each_release_serves():
    assert load_model("1.32").served == ()
    assert load_model("1.33").served == ()
    assert load_model("1.33", "resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true"
                      ).served == ("v1beta2", "v1beta1")
    for release in ("1.34", "1.35", "1.36", "1.37"):
        assert load_model(release).served == ("v1",)
        assert {"v1", "v1beta2", "v1beta1"} <= set(load_model(release).compiled)
    assert load_model("1.36", {"resource.k8s.io/v1": False}).served == ()
    assert load_model("1.36").enabled("DRADeviceTaints")
    assert not load_model("1.35").enabled("DRADeviceTaints")
    assert load_model("1.37").enabled("DRAExtendedResource")
    with pytest.raises(ValueError, match="unknown api group version"):
        load_model("1.32", "resource.k8s.io/v1=true")
    with pytest.raises(ValueError, match="unrecognized feature gate"):
        load_model("1.36", feature_gates="NoSuchGate=true")
    with pytest.raises(ValueError, match="not emulated"):
        load_model("1.33", "resource.k8s.io/v1alpha3=true")


@pytest.mark.parametrize(("sent", "stored"), [
    ("1024Mi", "1Gi"), ("1536Mi", "1536Mi"), ("0.5Gi", "512Mi"), ("1.5", "1500m"),
    ("1000", "1k"), ("1500", "1500"), (4, "4"), ("100m", "100m"), ("1e3", "1e3"),
    ("0", "0"), ("512", "512"), ("0.5Ki", "512"), ("1n", "1n"), ("0.1n", "1n"),
])
def test_quantities_are_stored_canonical(sent, stored):
    assert quantity.canonical(sent) == stored


def test_bad_quantity_is_refused_with_the_servers_message():
    slice_ = a_slice(devices=[o.device("d", capacity={"memory": "lots"})])
    assert validate(slice_) == [
        "ResourceSlice in version \"v1\" cannot be handled as a ResourceSlice: "
        "spec.devices[0].capacity[memory].value: quantities must match the regular expression "
        "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"]


async def test_empty_lists_and_maps_do_not_survive_storage(client):
    empty = a_slice(devices=[{"name": "fpga-0", "attributes": {}, "capacity": {}}])
    empty["metadata"]["labels"] = {}
    stored = (await client.create(SLICES, empty)).body
    assert stored["spec"]["devices"] == [{"name": "fpga-0"}]
    assert "labels" not in stored["metadata"]
    no_devices = (await client.create(SLICES, a_slice("other", devices=[]))).body
    assert "devices" not in no_devices["spec"]
    bad = a_slice("bad", devices=[o.device("d", {"x": {"bools": []}})])
    assert validate(bad, feature_gates="DRAListTypeAttributes=true") == [
        "spec.devices[0].attributes[x].bools: Invalid value: []: must not be empty if specified"]
    # Gate off (1.36 default): the server drops list values first, leaving no value at all.
    assert validate(bad) == ['spec.devices[0].attributes[x]: Invalid value: "": exactly one '
                             "value must be specified"]
