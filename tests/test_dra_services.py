"""What the DRA driver advertises, and the wire behind each service string a kubelet may pick."""

from __future__ import annotations

import re

import pytest

from api_versions import dra_services
from api_versions.dra_services import (
    DRA_PLUGIN_TYPE,
    SUPPORTED_VERSIONS,
    UnknownService,
    service_for_path,
    service_named,
    wire_for,
)

# The strings upstream defines (k8s.io/kubelet pkg/apis/dra*/.../types.go), typed out here.
UPSTREAM_NAMES = {
    "v1.DRAPlugin": ("k8s.io.kubelet.pkg.apis.dra.v1", "DRAPlugin"),
    "v1beta1.DRAPlugin": ("k8s.io.kubelet.pkg.apis.dra.v1beta1", "DRAPlugin"),
    "v1alpha3.NodeService": ("v1alpha3", "Node"),
    "v1alpha1.DRAResourceHealth": ("v1alpha1", "DRAResourceHealth"),
    # k8s.io/kubelet pkg/apis/dra-health/v1: `package v1;`, DRAResourceHealthService (1.37+).
    "v1.DRAResourceHealth": ("v1", "DRAResourceHealth"),
}


def test_type_is_the_plugin_watchers_dra_type():
    assert DRA_PLUGIN_TYPE == "DRAPlugin"


def test_advertised_order_puts_v1_first_and_keeps_a_semver_for_1_31():
    assert SUPPORTED_VERSIONS[:2] == ("v1.DRAPlugin", "v1beta1.DRAPlugin")
    assert "v1alpha1.DRAResourceHealth" in SUPPORTED_VERSIONS
    semver = [v for v in SUPPORTED_VERSIONS if re.fullmatch(r"v?\d+(\.\d+)+", v)]
    assert semver == ["1.0.0"], "1.31 needs exactly one parsable major-1 version"
    assert len(set(SUPPORTED_VERSIONS)) == len(SUPPORTED_VERSIONS)


@pytest.mark.parametrize("name", sorted(UPSTREAM_NAMES))
def test_each_service_string_maps_to_the_wire_the_kubelet_calls(name):
    package, service = UPSTREAM_NAMES[name]
    wire = wire_for(name)
    assert wire.package == package
    described = service_named(name)
    assert described.service == service
    methods = described.methods()
    expected = ({"NodeWatchResources"} if described.role is dra_services.Role.HEALTH
                else {"NodePrepareResources", "NodeUnprepareResources"})
    assert set(methods) == expected
    for method in methods.values():
        assert method.path.startswith(f"/{package}.{service}/")
        assert service_for_path(method.path) is described


def test_both_health_services_are_advertised_v1_first():
    """A 1.37 kubelet picks v1 whatever the order, a 1.34-1.36 one calls v1alpha1 unasked;
    listing v1 first says which one the driver prefers."""
    health = [v for v in SUPPORTED_VERSIONS if v.endswith(".DRAResourceHealth")]
    assert health == ["v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"]
    assert [s.name for s in dra_services.HEALTH_SERVICES] == health


def _fields(descriptor):
    return [(f.name, f.number, f.type, f.is_repeated,
             f.message_type.name if f.message_type else None,
             f.enum_type.name if f.enum_type else None) for f in descriptor.fields]


def test_health_v1_messages_are_v1alpha1s_under_another_package():
    v1, alpha = wire_for("v1.DRAResourceHealth"), wire_for("v1alpha1.DRAResourceHealth")
    for message in ("NodeWatchResourcesRequest", "NodeWatchResourcesResponse", "DeviceHealth",
                    "DeviceIdentifier"):
        assert _fields(v1.new(message).DESCRIPTOR) == _fields(alpha.new(message).DESCRIPTOR)
    status = v1.new("DeviceHealth").DESCRIPTOR.fields_by_name["health"].enum_type
    assert {v.name: v.number for v in status.values} == {
        "UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}
    sample = alpha.new("NodeWatchResourcesResponse", devices=[{
        "device": {"pool_name": "p", "device_name": "d"}, "health": 2,
        "last_updated_time": 5, "health_check_timeout_seconds": 30, "message": "m"}])
    assert v1.new("NodeWatchResourcesResponse").FromString(
        sample.SerializeToString()).devices[0].message == "m"


def test_plugin_services_follow_the_advertised_order():
    assert [s.name for s in dra_services.PLUGIN_SERVICES] == [
        "v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha3.NodeService"]


@pytest.mark.parametrize("name", ["1.0.0", "v1beta1.DRAResourceHealth", "DRAPlugin", ""])
def test_unknown_service_strings_are_refused(name):
    with pytest.raises(UnknownService):
        wire_for(name)


def test_unknown_paths_belong_to_no_service():
    assert service_for_path("/v1beta1.DevicePlugin/Allocate") is None
