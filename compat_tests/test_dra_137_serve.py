"""The real ``serve --api dra`` against emulated Kubernetes 1.36, 1.37 and 1.38.

Each case starts the API server and kubelet of the releases named (``compat_tests.dra_bench.Bench``)
and the real driver process, and asserts what such a cluster would see: the kubelet's device
health arriving through the health service that release picks (v1 from 1.37, v1alpha1 before),
slices published through resource.k8s.io/v1 with no request ever made to v1beta1 of a 1.38
server, and the standard ``resource.kubernetes.io/numaNode`` attribute on every device the
kernel gives a NUMA node, valid under the 1.37 schemas.
"""

from __future__ import annotations

import pytest

from compat_tests.apiserver import validate
from compat_tests.dra_bench import DRIVER, NODE, Bench, messages

NUMA_NODE = "resource.kubernetes.io/numaNode"


@pytest.fixture
def bench(dra_bench: Bench) -> Bench:
    """One node of emulated Kubernetes and a fake FPGA tree (compat_tests/conftest.py)."""
    return dra_bench


@pytest.mark.parametrize(("api", "kubelet", "service"), [
    ("1.36", "1.36", "v1alpha1.DRAResourceHealth"),
    ("1.37", "1.37", "v1.DRAResourceHealth"),
    ("1.38", "1.38", "v1.DRAResourceHealth"),
    ("1.37", "1.36", "v1alpha1.DRAResourceHealth"),  # kubelet one minor behind, as upgrades run
])
async def test_health_reaches_the_kubelet_through_the_service_its_release_picks(
        bench, api, kubelet, service):
    await bench.start_api(api)
    await bench.start_kubelet(kubelet)
    plugin = bench.serve(bench.kubeconfig())
    await bench.published(plugin)
    dra = bench.dra
    await bench.until_alive(
        plugin, lambda: any(u.driver == DRIVER and len(u.devices) == 8
                            for u in dra.health_updates), "eight ports in a health message")
    assert {u.service for u in dra.health_updates if u.driver == DRIVER} == {service}
    streams = [a for a in dra.health_attempts if a.driver == DRIVER]
    assert all(a.service == service for a in streams), streams
    assert {r.health for u in dra.health_updates for r in u.devices} == {"Healthy"}


async def test_a_1_38_server_gets_slices_and_claims_through_v1_and_never_a_v1beta1_request(
        bench):
    await bench.start_api("1.38")
    await bench.start_kubelet("1.38")
    plugin = bench.serve(bench.kubeconfig())
    await bench.published(plugin)
    creates = bench.api.find_requests(verb="create", resource="resourceslices")
    assert creates and {r.version for r in creates} == {"v1"}
    assert all(s["apiVersion"] == "resource.k8s.io/v1" for s in bench.api.list("resourceslices"))
    v1beta1 = [f"{r.method} {r.path}" for r in bench.api.requests
               if r.version == "v1beta1" or "/v1beta1" in r.path]
    assert v1beta1 == [], v1beta1
    # Nothing about the API versions: the one warning allowed is that this node has no
    # kubelet PodResources socket (the plugin then offers every device, as it says).
    said = [m for m in messages(plugin, "warning", "error")
            if not m.startswith("cannot read the kubelet's PodResources API")]
    assert said == []


async def test_every_device_with_a_numa_node_carries_the_standard_attribute(bench):
    bench.fake.add_dfl_card("0000:d8:00.0", ports=1, numa_node=1)
    bench.fake.add_dfl_card("0000:e1:00.0", ports=1, numa_node=-1)  # the kernel knows none
    await bench.start_api("1.37")
    await bench.start_kubelet("1.37")
    plugin = bench.serve(bench.kubeconfig())
    await bench.published(plugin, count=10)
    devices = bench.devices()
    numa = {name: d["attributes"].get(NUMA_NODE) for name, d in devices.items()}
    by_bus: dict[str, object] = {}
    for name, value in numa.items():
        by_bus.setdefault(name.split("-")[2], value)  # pci-0000-<bus>-00-0[-portN]
    assert all(numa[name] == by_bus[name.split("-")[2]] for name in numa), numa
    assert all(by_bus[bus] == {"int": 0} for bus in ("3b", "5e", "86", "af")), by_bus
    assert by_bus["d8"] == {"int": 1}
    assert by_bus["e1"] is None, "no NUMA node: the attribute is left out, never -1"
    for device in devices.values():
        assert len(device.get("attributes", {})) + len(device.get("capacity", {})) <= 32
    for published in bench.slices():
        assert published["spec"]["nodeName"] == NODE
        assert validate(_as_sent(published), model="1.37") == []


def _as_sent(stored: dict) -> dict:
    """A stored slice with the fields the server sets taken out, so it validates as a create."""
    meta = {k: v for k, v in stored["metadata"].items()
            if k in ("name", "generateName", "labels", "ownerReferences")}
    return {**stored, "metadata": meta}
