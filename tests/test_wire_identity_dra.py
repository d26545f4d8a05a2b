"""The DRA protos must be wire-identical to the kubelet's: package, services, fields, numbers.

The expected tables are written from upstream's api.proto files (k8s.io/kubelet at
v0.31.0 ``pkg/apis/dra/v1alpha4``, v0.32.0..v0.37.0-beta.0 ``pkg/apis/dra/v1beta1``,
v0.34.0..v0.37.0-beta.0 ``pkg/apis/dra/v1`` and ``pkg/apis/dra-health/v1alpha1``), not read from
our own protos, so a renumbered, retyped or renamed field fails here before a kubelet sees it.
The method paths are the strings a kubelet of each release puts on the wire.
"""

from __future__ import annotations

import pytest
from google.protobuf.descriptor import FieldDescriptor as F

from api_versions.wire import WireApi

S, I64, MSG, ENUM = F.TYPE_STRING, F.TYPE_INT64, F.TYPE_MESSAGE, F.TYPE_ENUM
REP, ONE = "repeated", "optional"

# v1beta1 (1.32+) and v1alpha4 (1.31) carry the same messages; v1 adds Device.share_id (1.35).
PLUGIN_MESSAGES = {
    "NodePrepareResourcesRequest": {"claims": (1, MSG, REP)},
    "NodePrepareResourcesResponse": {"claims": (1, MSG, REP)},
    "NodePrepareResourceResponse": {"devices": (1, MSG, REP), "error": (2, S, ONE)},
    "Device": {"request_names": (1, S, REP), "pool_name": (2, S, ONE),
               "device_name": (3, S, ONE), "cdi_device_ids": (4, S, REP)},
    "NodeUnprepareResourcesRequest": {"claims": (1, MSG, REP)},
    "NodeUnprepareResourcesResponse": {"claims": (1, MSG, REP)},
    "NodeUnprepareResourceResponse": {"error": (1, S, ONE)},
    "Claim": {"namespace": (1, S, ONE), "uid": (2, S, ONE), "name": (3, S, ONE)},
}

EXPECTED: dict[str, dict[str, dict[str, tuple[int, int, str]]]] = {
    "dra_v1alpha4": PLUGIN_MESSAGES,
    "dra_v1beta1": PLUGIN_MESSAGES,
    "dra_v1": {**PLUGIN_MESSAGES,
               "Device": {**PLUGIN_MESSAGES["Device"], "share_id": (5, S, ONE)}},
    "dra_health_v1alpha1": {
        "NodeWatchResourcesRequest": {},
        "DeviceIdentifier": {"pool_name": (1, S, ONE), "device_name": (2, S, ONE)},
        "DeviceHealth": {"device": (1, MSG, ONE), "health": (2, ENUM, ONE),
                         "last_updated_time": (3, I64, ONE),
                         "health_check_timeout_seconds": (4, I64, ONE),
                         "message": (5, S, ONE)},
        "NodeWatchResourcesResponse": {"devices": (1, MSG, REP)},
    },
}

# Map fields: name -> value message. Everything else must not be a map.
MAPS = {
    (generation, message): value
    for generation in ("dra_v1alpha4", "dra_v1beta1", "dra_v1")
    for message, value in (("NodePrepareResourcesResponse", "NodePrepareResourceResponse"),
                           ("NodeUnprepareResourcesResponse", "NodeUnprepareResourceResponse"))
}

# Fields with explicit presence (proto3 ``optional``).
PRESENCE = {("dra_v1", "Device", "share_id")}

PLUGIN_METHODS = {
    "NodePrepareResources": ("NodePrepareResourcesRequest", "NodePrepareResourcesResponse", False),
    "NodeUnprepareResources": ("NodeUnprepareResourcesRequest", "NodeUnprepareResourcesResponse",
                               False),
}

SERVICES = {
    "dra_v1": ("k8s.io.kubelet.pkg.apis.dra.v1", "DRAPlugin", PLUGIN_METHODS),
    "dra_v1beta1": ("k8s.io.kubelet.pkg.apis.dra.v1beta1", "DRAPlugin", PLUGIN_METHODS),
    "dra_v1alpha4": ("v1alpha3", "Node", PLUGIN_METHODS),
    "dra_health_v1alpha1": ("v1alpha1", "DRAResourceHealth", {
        "NodeWatchResources": ("NodeWatchResourcesRequest", "NodeWatchResourcesResponse", True)}),
}

# The paths as a kubelet sends them (its grpc-go client stubs), spelled out in full.
PATHS = {
    ("dra_v1", "NodePrepareResources"):
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
    ("dra_v1", "NodeUnprepareResources"):
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
    ("dra_v1beta1", "NodePrepareResources"):
        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources",
    ("dra_v1beta1", "NodeUnprepareResources"):
        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources",
    ("dra_v1alpha4", "NodePrepareResources"): "/v1alpha3.Node/NodePrepareResources",
    ("dra_v1alpha4", "NodeUnprepareResources"): "/v1alpha3.Node/NodeUnprepareResources",
    ("dra_health_v1alpha1", "NodeWatchResources"): "/v1alpha1.DRAResourceHealth/NodeWatchResources",
}


def _label(field: F) -> str:
    return REP if field.is_repeated else ONE


@pytest.mark.parametrize("generation", sorted(EXPECTED))
def test_messages_match_upstream_numbers_and_types(generation: str) -> None:
    wire = WireApi.load(generation)
    for message, fields in EXPECTED[generation].items():
        descriptor = wire.message(message).DESCRIPTOR
        actual = {f.name: (f.number, f.type, _label(f)) for f in descriptor.fields}
        assert actual == fields, f"{generation}.{message}"
        for field in descriptor.fields:
            entry = field.message_type
            is_map = entry is not None and entry.GetOptions().map_entry
            expected_value = MAPS.get((generation, message)) if field.name == "claims" else None
            assert bool(is_map) == (expected_value is not None), f"{message}.{field.name} map-ness"
            if is_map:
                key, value = entry.fields_by_name["key"], entry.fields_by_name["value"]
                assert key.type == S, f"{message}.{field.name} is keyed by claim UID (string)"
                assert value.message_type.name == expected_value
            explicit = (generation, message, field.name) in PRESENCE
            singular_message = field.type == MSG and not field.is_repeated
            assert field.has_presence == (explicit or singular_message), (
                f"{message}.{field.name} presence")


@pytest.mark.parametrize("generation", sorted(SERVICES))
def test_services_and_method_paths_match_upstream(generation: str) -> None:
    package, service, methods = SERVICES[generation]
    wire = WireApi.load(generation)
    assert wire.package == package
    actual = wire.methods(service)
    assert set(actual) == set(methods)
    for name, (request, response, streaming) in methods.items():
        method = actual[name]
        assert method.path == PATHS[(generation, name)]
        assert method.request.DESCRIPTOR.name == request
        assert method.response.DESCRIPTOR.name == response
        assert method.server_streaming is streaming
        assert method.client_streaming is False


def test_health_status_enum_matches_upstream() -> None:
    enum = WireApi.load("dra_health_v1alpha1").message("DeviceHealth").DESCRIPTOR.fields_by_name[
        "health"].enum_type
    assert enum.full_name == "v1alpha1.HealthStatus"
    assert {v.name: v.number for v in enum.values} == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}


def test_packages_that_share_names_with_device_plugin_generations_coexist() -> None:
    """``v1alpha1`` (DRA health) and ``v1alpha3`` (1.31 DRA) live in pools of their own, beside
    the device-plugin generations, so loading all of them in one process cannot clash."""
    names = ["v1alpha1", "v1alpha2", "v1beta1", "pluginregistration", "dra_v1", "dra_v1beta1",
             "dra_v1alpha4", "dra_health_v1alpha1"]
    loaded = {name: WireApi.load(name) for name in names}
    assert loaded["dra_health_v1alpha1"].package == "v1alpha1"
    assert loaded["v1alpha1"].package == "deviceplugin"
    v1 = loaded["dra_v1"].message("Device")
    beta = loaded["dra_v1beta1"].message("Device")
    assert v1.DESCRIPTOR.full_name != beta.DESCRIPTOR.full_name


def test_hand_encoded_kubelet_bytes_decode() -> None:
    """Bytes as a Go kubelet or driver would put them on the wire, encoded by hand."""
    # Claim{namespace: "ns", uid: "u1", name: "c"} inside NodePrepareResourcesRequest.claims
    claim = b"\x0a\x02ns" + b"\x12\x02u1" + b"\x1a\x01c"
    raw = b"\x0a" + bytes([len(claim)]) + claim
    for generation in ("dra_v1", "dra_v1beta1", "dra_v1alpha4"):
        request = WireApi.load(generation).message("NodePrepareResourcesRequest").FromString(raw)
        assert [(c.namespace, c.uid, c.name) for c in request.claims] == [("ns", "u1", "c")]

    # NodePrepareResourcesResponse{claims: {"u1": {devices: [{pool_name: "p", device_name: "d",
    # cdi_device_ids: ["v/c=x"], share_id: "s"}]}}}: a map entry is {key = 1, value = 2}.
    device = b"\x12\x01p" + b"\x1a\x01d" + b"\x22\x05v/c=x" + b"\x2a\x01s"
    value = b"\x0a" + bytes([len(device)]) + device
    entry = b"\x0a\x02u1" + b"\x12" + bytes([len(value)]) + value
    raw = b"\x0a" + bytes([len(entry)]) + entry
    v1 = WireApi.load("dra_v1").message("NodePrepareResourcesResponse").FromString(raw)
    got = v1.claims["u1"].devices[0]
    assert (got.pool_name, got.device_name, list(got.cdi_device_ids)) == ("p", "d", ["v/c=x"])
    assert got.HasField("share_id") and got.share_id == "s"
    # A v1beta1 reader keeps share_id as an unknown field and reads the rest the same.
    beta = WireApi.load("dra_v1beta1").message("NodePrepareResourcesResponse").FromString(raw)
    assert beta.claims["u1"].devices[0].device_name == "d"

    # DeviceHealth{device: {pool_name: "p", device_name: "d"}, health: UNHEALTHY,
    #              last_updated_time: 5, health_check_timeout_seconds: 7, message: "hot"}
    ident = b"\x0a\x01p" + b"\x12\x01d"
    health = (b"\x0a" + bytes([len(ident)]) + ident + b"\x10\x02" + b"\x18\x05" + b"\x20\x07"
              + b"\x2a\x03hot")
    response = b"\x0a" + bytes([len(health)]) + health
    decoded = WireApi.load("dra_health_v1alpha1").message("NodeWatchResourcesResponse").FromString(
        response)
    only = decoded.devices[0]
    assert (only.device.pool_name, only.device.device_name, only.health, only.last_updated_time,
            only.health_check_timeout_seconds, only.message) == ("p", "d", 2, 5, 7, "hot")
