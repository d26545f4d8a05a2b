"""The kubelet's PodResources API (``v1.PodResourcesLister``), read by a node agent.

The kubelet serves it on ``<kubelet root>/pod-resources/kubelet.sock`` (protos/podresources_v1,
wire-identical to upstream ``staging/src/k8s.io/kubelet/pkg/apis/podresources/v1/api.proto``).
``List`` gives every active pod's containers with the device-plugin devices the device manager
assigned them (restored from its checkpoint at a kubelet start, so a kubelet upgraded under
running containers reports them at once) and, where the kubelet has
KubeletPodResourcesDynamicResources on (beta, on by default, from 1.34), the DRA claims each
container uses with their devices. A kubelet before that leaves ``dynamic_resources`` empty,
so "no claim listed" never proves a device free: the driver's own checkpoint says that.

This module only speaks the wire: one bounded ``List`` call, its answer as plain tuples. What
the devices mean to this plugin is :mod:`plugin.model.held`'s business.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc

from api_versions.wire import WireApi, client_call

GENERATION = "podresources_v1"
SERVICE = "PodResourcesLister"
LIST_TIMEOUT = 2.0
"""How long one ``List`` may take: a kubelet answers from memory in milliseconds; one that
takes seconds is hung, and the caller must not wait on it."""
MAX_MESSAGE = 16 * 1024 * 1024
"""A node with many pods answers with a large message (node-feature-discovery's client allows
16 MiB for the same reason); gRPC's default 4 MiB would refuse it."""
_OPTIONS = (("grpc.use_local_subchannel_pool", 1),
            ("grpc.max_receive_message_length", MAX_MESSAGE))


class PodResourcesUnavailable(Exception):
    """The socket is missing, refuses, hangs or answers an error. ``kind`` is one of
    ``missing``, ``refused``, ``timeout``, ``error``: what a warning says once per kind."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True, slots=True)
class ContainerDevices:
    """Device-plugin devices the kubelet assigned one container."""

    namespace: str
    pod: str
    container: str
    resource_name: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ClaimDevice:
    """One DRA device a container uses through a claim."""

    namespace: str
    pod: str
    container: str
    claim_namespace: str
    claim_name: str
    driver: str
    pool: str
    device: str


@dataclass(frozen=True, slots=True)
class Listing:
    """What one ``List`` said."""

    devices: tuple[ContainerDevices, ...]
    claims: tuple[ClaimDevice, ...]


def parse_list(response: object) -> Listing:
    """A ``ListPodResourcesResponse`` as plain tuples (empty IDs and names dropped)."""
    devices: list[ContainerDevices] = []
    claims: list[ClaimDevice] = []
    for pod in getattr(response, "pod_resources", ()):
        for container in pod.containers:
            for entry in container.devices:
                ids = tuple(i for i in entry.device_ids if i)
                if entry.resource_name and ids:
                    devices.append(ContainerDevices(pod.namespace, pod.name, container.name,
                                                    entry.resource_name, ids))
            for dynamic in container.dynamic_resources:
                for resource in dynamic.claim_resources:
                    if resource.driver_name and resource.device_name:
                        claims.append(ClaimDevice(
                            pod.namespace, pod.name, container.name, dynamic.claim_namespace,
                            dynamic.claim_name, resource.driver_name, resource.pool_name,
                            resource.device_name))
    return Listing(tuple(devices), tuple(claims))


async def list_pod_resources(socket: Path, timeout: float = LIST_TIMEOUT) -> Listing:
    """One ``List`` over ``socket`` within ``timeout`` seconds; PodResourcesUnavailable
    otherwise. Each call dials anew: a kubelet restarts under a long-lived agent, and a
    shared connection's reconnect back-off would keep a restarted kubelet unreachable."""
    if not socket.exists():
        raise PodResourcesUnavailable("missing", f"{socket} does not exist")
    wire = WireApi.load(GENERATION)
    method = wire.method(SERVICE, "List")
    try:
        async with grpc.aio.insecure_channel(f"unix://{socket.absolute()}",
                                             options=_OPTIONS) as channel:
            call = client_call(channel, method)
            response = await call(wire.new("ListPodResourcesRequest"), timeout=timeout)
    except grpc.aio.AioRpcError as error:
        code = error.code()
        if code is grpc.StatusCode.DEADLINE_EXCEEDED:
            raise PodResourcesUnavailable(
                "timeout", f"{socket} did not answer List within {timeout:g} s") from None
        if code is grpc.StatusCode.UNAVAILABLE:
            raise PodResourcesUnavailable(
                "refused", f"{socket} refuses connections ({error.details()})") from None
        raise PodResourcesUnavailable(
            "error", f"{socket} answered List with {code.name}: {error.details()}") from None
    return parse_list(response)
