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


def test_plugin_services_follow_the_advertised_order():
    assert [s.name for s in dra_services.PLUGIN_SERVICES] == [
        "v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha3.NodeService"]


@pytest.mark.parametrize("name", ["1.0.0", "v1.DRAResourceHealth", "DRAPlugin", ""])
def test_unknown_service_strings_are_refused(name):
    with pytest.raises(UnknownService):
        wire_for(name)


def test_unknown_paths_belong_to_no_service():
    assert service_for_path("/v1beta1.DevicePlugin/Allocate") is None
