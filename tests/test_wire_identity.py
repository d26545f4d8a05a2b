"""The protos must be wire-identical to the kubelet's: package, services, fields and numbers.

The expected tables are written from the upstream API definitions of each release, not read
from our own protos, so a renumbered or retyped field fails here before a kubelet sees it.
"""

from __future__ import annotations

import pytest
from google.protobuf.descriptor import FieldDescriptor as F

from api_versions.wire import WireApi

S, B, I64, I32, MSG = F.TYPE_STRING, F.TYPE_BOOL, F.TYPE_INT64, F.TYPE_INT32, F.TYPE_MESSAGE
REP = "repeated"
ONE = "optional"

COMMON = {
    "RegisterRequest": {"version": (1, S, ONE), "endpoint": (2, S, ONE),
                        "resource_name": (3, S, ONE)},
    "Empty": {},
    "ListAndWatchResponse": {"devices": (1, MSG, REP)},
    "Mount": {"container_path": (1, S, ONE), "host_path": (2, S, ONE), "read_only": (3, B, ONE)},
    "DeviceSpec": {"container_path": (1, S, ONE), "host_path": (2, S, ONE),
                   "permissions": (3, S, ONE)},
}

EXPECTED: dict[str, dict[str, dict[str, tuple[int, int, str]]]] = {
    "v1alpha1": {
        **COMMON,
        "Device": {"ID": (1, S, ONE), "health": (2, S, ONE)},
        "AllocateRequest": {"devicesIDs": (1, S, REP)},
        "AllocateResponse": {"spec": (1, MSG, REP)},
        "DeviceRuntimeSpec": {"ID": (1, S, ONE), "envs": (2, MSG, REP), "mounts": (3, MSG, REP),
                              "devices": (4, MSG, REP)},
    },
    "v1alpha2": {
        **COMMON,
        "Device": {"ID": (1, S, ONE), "health": (2, S, ONE)},
        "AllocateRequest": {"devicesIDs": (1, S, REP)},
        "AllocateResponse": {"envs": (1, MSG, REP), "mounts": (2, MSG, REP),
                             "devices": (3, MSG, REP)},
    },
    "v1beta1": {
        **COMMON,
        "RegisterRequest": {**COMMON["RegisterRequest"], "options": (4, MSG, ONE)},
        "DevicePluginOptions": {"pre_start_required": (1, B, ONE),
                                "get_preferred_allocation_available": (2, B, ONE)},
        "Device": {"ID": (1, S, ONE), "health": (2, S, ONE), "topology": (3, MSG, ONE)},
        "TopologyInfo": {"nodes": (1, MSG, REP)},
        "NUMANode": {"ID": (1, I64, ONE)},
        "PreStartContainerRequest": {"devices_ids": (1, S, REP)},
        "PreStartContainerResponse": {},
        "PreferredAllocationRequest": {"container_requests": (1, MSG, REP)},
        "ContainerPreferredAllocationRequest": {"available_deviceIDs": (1, S, REP),
                                                "must_include_deviceIDs": (2, S, REP),
                                                "allocation_size": (3, I32, ONE)},
        "PreferredAllocationResponse": {"container_responses": (1, MSG, REP)},
        "ContainerPreferredAllocationResponse": {"deviceIDs": (1, S, REP)},
        "AllocateRequest": {"container_requests": (1, MSG, REP)},
        "ContainerAllocateRequest": {"devices_ids": (1, S, REP)},
        "AllocateResponse": {"container_responses": (1, MSG, REP)},
        "ContainerAllocateResponse": {"envs": (1, MSG, REP), "mounts": (2, MSG, REP),
                                      "devices": (3, MSG, REP), "annotations": (4, MSG, REP),
                                      "cdi_devices": (5, MSG, REP)},
        "CDIDevice": {"name": (1, S, ONE)},
    },
    # k8s.io/kubelet/pkg/apis/pluginregistration/v1/api.proto
    "pluginregistration": {
        "PluginInfo": {"type": (1, S, ONE), "name": (2, S, ONE), "endpoint": (3, S, ONE),
                       "supported_versions": (4, S, REP)},
        "RegistrationStatus": {"plugin_registered": (1, B, ONE), "error": (2, S, ONE)},
        "RegistrationStatusResponse": {},
        "InfoRequest": {},
    },
}

SERVICES = {
    "v1alpha1": ("deviceplugin", {"Registration": {"Register": ("RegisterRequest", "Empty", False)},
                                  "DevicePlugin": {
                                      "ListAndWatch": ("Empty", "ListAndWatchResponse", True),
                                      "Allocate": ("AllocateRequest", "AllocateResponse", False)}}),
    "v1beta1": ("v1beta1", {"Registration": {"Register": ("RegisterRequest", "Empty", False)},
                            "DevicePlugin": {
                                "GetDevicePluginOptions": ("Empty", "DevicePluginOptions", False),
                                "ListAndWatch": ("Empty", "ListAndWatchResponse", True),
                                "GetPreferredAllocation": ("PreferredAllocationRequest",
                                                           "PreferredAllocationResponse", False),
                                "Allocate": ("AllocateRequest", "AllocateResponse", False),
                                "PreStartContainer": ("PreStartContainerRequest",
                                                      "PreStartContainerResponse", False)}}),
}
SERVICES["v1alpha2"] = SERVICES["v1alpha1"]
SERVICES["pluginregistration"] = ("pluginregistration", {"Registration": {
    "GetInfo": ("InfoRequest", "PluginInfo", False),
    "NotifyRegistrationStatus": ("RegistrationStatus", "RegistrationStatusResponse", False)}})

MAPS = {("v1alpha1", "DeviceRuntimeSpec", "envs"), ("v1alpha2", "AllocateResponse", "envs"),
        ("v1beta1", "ContainerAllocateResponse", "envs"),
        ("v1beta1", "ContainerAllocateResponse", "annotations")}


def _label(field: F) -> str:
    return REP if field.is_repeated else ONE


@pytest.mark.parametrize("generation", sorted(EXPECTED))
def test_messages_match_upstream_numbers_and_types(generation: str) -> None:
    wire = WireApi.load(generation)
    for message, fields in EXPECTED[generation].items():
        descriptor = wire.message(message).DESCRIPTOR
        actual = {f.name: (f.number, f.type, _label(f)) for f in descriptor.fields}
        assert actual == fields, f"{generation}.{message}"
        for name in fields:
            is_map = descriptor.fields_by_name[name].message_type is not None and (
                descriptor.fields_by_name[name].message_type.GetOptions().map_entry
            )
            assert is_map == ((generation, message, name) in MAPS), f"{message}.{name} map-ness"


@pytest.mark.parametrize("generation", sorted(SERVICES))
def test_services_and_method_paths_match_upstream(generation: str) -> None:
    package, services = SERVICES[generation]
    wire = WireApi.load(generation)
    assert wire.package == package
    for service, methods in services.items():
        actual = wire.methods(service)
        assert set(actual) == set(methods)
        for name, (request, response, streaming) in methods.items():
            method = actual[name]
            assert method.path == f"/{package}.{service}/{name}"
            assert method.request.DESCRIPTOR.name == request
            assert method.response.DESCRIPTOR.name == response
            assert method.server_streaming is streaming


def test_alpha_generations_coexist_with_incompatible_allocate_responses() -> None:
    one = WireApi.load("v1alpha1").message("AllocateResponse")
    two = WireApi.load("v1alpha2").message("AllocateResponse")
    assert one.DESCRIPTOR.full_name == two.DESCRIPTOR.full_name == "deviceplugin.AllocateResponse"
    assert one(spec=[{"ID": "0"}]).spec[0].ID == "0"
    assert dict(two(envs={"A": "b"}).envs) == {"A": "b"}


def test_hand_encoded_kubelet_bytes_decode() -> None:
    """Bytes as a Go kubelet would put them on the wire, encoded by hand from the field table."""
    # v1beta1 AllocateRequest{container_requests: [{devices_ids: ["1", "3"]}]}
    inner = b"\x0a\x011" + b"\x0a\x013"
    raw = b"\x0a" + bytes([len(inner)]) + inner
    request = WireApi.load("v1beta1").message("AllocateRequest").FromString(raw)
    assert [list(c.devices_ids) for c in request.container_requests] == [["1", "3"]]
    # v1alpha1/2 AllocateRequest{devicesIDs: ["7"]}
    for generation in ("v1alpha1", "v1alpha2"):
        alpha = WireApi.load(generation).message("AllocateRequest").FromString(b"\x0a\x017")
        assert list(alpha.devicesIDs) == ["7"]
    # v1beta1 Device{ID: "a", health: "Healthy", topology: {nodes: [{ID: 1}]}}
    device = WireApi.load("v1beta1").new(
        "Device", ID="a", health="Healthy", topology={"nodes": [{"ID": 1}]}
    )
    assert device.SerializeToString() == (
        b"\x0a\x01a" + b"\x12\x07Healthy" + b"\x1a\x04" + b"\x0a\x02\x08\x01"
    )
