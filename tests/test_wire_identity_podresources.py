"""protos/podresources_v1 is upstream's v1 PodResourcesLister, field for field.

Expected values read from kubernetes/kubernetes
``staging/src/k8s.io/kubelet/pkg/apis/podresources/v1/api.proto`` (commit 95f08499d652):
a field number or a method path that differs would make the kubelet's answer unreadable.
"""

from __future__ import annotations

from api_versions.podresources import GENERATION, SERVICE, parse_list
from api_versions.wire import WireApi

FIELDS = {
    "ListPodResourcesResponse": {"pod_resources": 1},
    "PodResources": {"name": 1, "namespace": 2, "containers": 3},
    "ContainerResources": {"name": 1, "devices": 2, "cpu_ids": 3, "memory": 4,
                           "dynamic_resources": 5},
    "ContainerDevices": {"resource_name": 1, "device_ids": 2, "topology": 3},
    "ContainerMemory": {"memory_type": 1, "size": 2, "topology": 3},
    "TopologyInfo": {"nodes": 1},
    "NUMANode": {"ID": 1},
    "DynamicResource": {"claim_name": 2, "claim_namespace": 3, "claim_resources": 4},
    "ClaimResource": {"cdi_devices": 1, "driver_name": 2, "pool_name": 3, "device_name": 4},
    "CDIDevice": {"name": 1},
    "AllocatableResourcesResponse": {"devices": 1, "cpu_ids": 2, "memory": 3},
    "GetPodResourcesRequest": {"pod_name": 1, "pod_namespace": 2},
    "GetPodResourcesResponse": {"pod_resources": 1},
    "ListPodResourcesRequest": {},
    "AllocatableResourcesRequest": {},
}


def test_package_service_and_paths():
    wire = WireApi.load(GENERATION)
    assert wire.package == "v1"
    assert {name: m.path for name, m in wire.methods(SERVICE).items()} == {
        "List": "/v1.PodResourcesLister/List",
        "GetAllocatableResources": "/v1.PodResourcesLister/GetAllocatableResources",
        "Get": "/v1.PodResourcesLister/Get",
    }


def test_every_field_number():
    wire = WireApi.load(GENERATION)
    for message, fields in FIELDS.items():
        found = {f.name: f.number for f in wire.message(message).DESCRIPTOR.fields}
        assert found == fields, message


def test_a_listing_from_bytes_a_kubelet_would_send():
    wire = WireApi.load(GENERATION)
    sent = wire.new("ListPodResourcesResponse", pod_resources=[wire.new(
        "PodResources", name="p", namespace="ns", containers=[wire.new(
            "ContainerResources", name="c",
            devices=[wire.new("ContainerDevices", resource_name="r/x", device_ids=["a", ""])],
            dynamic_resources=[wire.new("DynamicResource", claim_name="k", claim_namespace="ns",
                                        claim_resources=[wire.new(
                                            "ClaimResource", driver_name="d", pool_name="n",
                                            device_name="dev")])])])])
    listing = parse_list(wire.message("ListPodResourcesResponse").FromString(
        sent.SerializeToString()))
    assert [(d.pod, d.device_ids) for d in listing.devices] == [("p", ("a",))]
    assert [(c.claim_name, c.device) for c in listing.claims] == [("k", "dev")]
