"""The emulated kubelets' PodResources API, per release, read through the plugin's own client.

Versions from kubernetes/kubernetes ``pkg/features/kube_features.go``:
KubeletPodResourcesGetAllocatable beta (on) 1.23; KubeletPodResourcesGet and
KubeletPodResourcesDynamicResources alpha 1.27, beta (on) 1.34; the v1 service from 1.20.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from api_versions.podresources import (
    GENERATION,
    SERVICE,
    PodResourcesUnavailable,
    list_pod_resources,
)
from api_versions.wire import WireApi, client_call
from compat_tests.kubelet import DraConfig, KubeletEmulator
from compat_tests.kubelet.podresources import PodClaimDevice, PodContainer

RESOURCE = "b-com.com/accelerator"
CLAIM = PodClaimDevice("default", "c", "accelerator.b-com.com", "node-a", "pci-0000-3b-00-0",
                       ("accelerator.b-com.com/port=0000:3b:00.0",))


async def call(socket: Path, method: str, **fields: str) -> object:
    wire = WireApi.load(GENERATION)
    spec = wire.method(SERVICE, method)
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        return await client_call(channel, spec)(wire.new(spec.request.DESCRIPTOR.name,
                                                         **fields), timeout=5)


def kubelet_on(sockdir: Path, model: str) -> KubeletEmulator:
    return KubeletEmulator(sockdir, model, pod_resources_socket=sockdir / "pr" / "kubelet.sock",
                           dra=DraConfig())


@pytest.mark.parametrize("model, claims_listed, get_served", [
    ("1.33", False, False), ("1.34", True, True), ("1.36", True, True)])
async def test_list_and_get_per_release(sockdir, model, claims_listed, get_served):
    kubelet = kubelet_on(sockdir, model)
    kubelet.pods.add(PodContainer("default", "p", "main", {RESOURCE: ["0000:3b:00.0"]},
                                  [CLAIM]))
    async with kubelet:
        socket = sockdir / "pr" / "kubelet.sock"
        listing = await list_pod_resources(socket)
        [held] = listing.devices
        assert (held.namespace, held.pod, held.container, held.resource_name,
                held.device_ids) == ("default", "p", "main", RESOURCE, ("0000:3b:00.0",))
        assert bool(listing.claims) is claims_listed
        if claims_listed:
            [claim] = listing.claims
            assert (claim.claim_namespace, claim.claim_name, claim.device) == \
                ("default", "c", "pci-0000-3b-00-0")
        if get_served:
            answer = await call(socket, "Get", pod_name="p", pod_namespace="default")
            assert answer.pod_resources.name == "p"  # type: ignore[attr-defined]
        else:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call(socket, "Get", pod_name="p", pod_namespace="default")
            assert refused.value.details() == "PodResources API Get method disabled"


async def test_get_allocatable_resources_from_1_23(sockdir):
    async with kubelet_on(sockdir, "1.22"):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call(sockdir / "pr" / "kubelet.sock", "GetAllocatableResources")
        assert "GetAllocatableResources disabled" in (refused.value.details() or "")
    async with kubelet_on(sockdir, "1.23"):
        await call(sockdir / "pr" / "kubelet.sock", "GetAllocatableResources")


async def test_no_pod_resources_before_1_20(sockdir):
    async with kubelet_on(sockdir, "1.19"):
        with pytest.raises(PodResourcesUnavailable) as missing:
            await list_pod_resources(sockdir / "pr" / "kubelet.sock")
        assert missing.value.kind == "missing"


async def test_containers_outlive_a_kubelet_upgrade_and_end_with_their_pod(sockdir):
    """A 1.33 kubelet's allocation is listed by the 1.36 kubelet started on the same
    directory (restored from the device manager's checkpoint), until the pod ends."""
    socket = sockdir / "pr" / "kubelet.sock"
    async with kubelet_on(sockdir, "1.33") as old:
        old.pods.add(PodContainer("default", "p", "main", {RESOURCE: ["0000:3b:00.0"]}))
    assert not socket.exists(), "the socket goes with its kubelet"
    async with kubelet_on(sockdir, "1.36") as new:
        assert [d.pod for d in (await list_pod_resources(socket)).devices] == ["p"]
        new.end_pod("default", "p")
        assert (await list_pod_resources(socket)).devices == ()


async def test_a_hung_kubelet_is_a_bounded_wait(sockdir):
    kubelet = KubeletEmulator(sockdir, "1.36", pod_resources_socket=sockdir / "pr" / "k.sock",
                              hang_pod_resources=True)
    async with kubelet:
        with pytest.raises(PodResourcesUnavailable) as hung:
            await list_pod_resources(sockdir / "pr" / "k.sock", timeout=0.3)
        assert hung.value.kind == "timeout"
