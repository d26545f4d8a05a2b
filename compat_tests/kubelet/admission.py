"""What the emulated kubelet does at pod admission: Allocate, preferred allocation, and the
containers it then runs until their pod ends.

A mixin of :class:`~compat_tests.kubelet.emulator.KubeletEmulator`, kept apart from the
registration and stream handling there; the attributes below are the emulator's.
"""

from __future__ import annotations

from collections.abc import Callable

from compat_tests.kubelet.endpoint import PluginEndpoint
from compat_tests.kubelet.models import KubeletModel
from compat_tests.kubelet.podresources import NodePods, PodClaimDevice, PodContainer
from compat_tests.kubelet.results import (
    ContainerAllocation,
    FeatureUnavailable,
    KubeletError,
    NotRegistered,
)


class PodAdmission:
    """Allocate and the pods of one kubelet, from its registered endpoints."""

    model: KubeletModel
    pods: NodePods
    _endpoints: dict[str, PluginEndpoint]
    _notify: Callable[[], None]

    def _endpoint(self, resource_name: str) -> PluginEndpoint:
        endpoint = self._endpoints.get(resource_name)
        if endpoint is None:
            raise NotRegistered(f"Unknown Device Plugin {resource_name}")
        return endpoint

    async def allocate(self, resource_name: str, device_ids: list[str]) -> ContainerAllocation:
        """Allocate ``device_ids`` for one container, as the kubelet does at pod admission.

        The IDs go to the plugin unchecked, so tests can see how the plugin refuses IDs it
        does not own. Raises PluginCallError (gRPC code and message) if the plugin refuses.
        """
        return await self._endpoint(resource_name).allocate(list(device_ids))

    async def run_pod(self, namespace: str, pod: str, container: str, resource_name: str,
                      device_ids: list[str]) -> ContainerAllocation:
        """Admit a pod whose container gets ``device_ids`` through the device plugin: refused
        (KubeletError) for a device another running container holds, as the device manager
        never hands one out twice; Allocate; then the container runs until :meth:`end_pod`,
        reported by PodResources, across kubelet restarts."""
        taken = self.pods.devices_in_use(resource_name) & set(device_ids)
        if taken:
            raise KubeletError(f"devices {sorted(taken)} of {resource_name} are in use")
        allocation = await self.allocate(resource_name, device_ids)
        self.pods.add(PodContainer(namespace, pod, container, {resource_name: list(device_ids)}))
        self._notify()
        return allocation

    def run_pod_with_claims(self, namespace: str, pod: str, container: str,
                            claims: list[PodClaimDevice]) -> None:
        """A container using prepared DRA claims (prepare them through ``dra`` first)."""
        self.pods.add(PodContainer(namespace, pod, container, claims=list(claims)))
        self._notify()

    def end_pod(self, namespace: str, pod: str) -> None:
        """The pod's containers ended: its devices are free again."""
        self.pods.end(namespace, pod)
        self._notify()

    async def preferred_allocation(
        self, resource_name: str, available: list[str], must_include: list[str], size: int
    ) -> list[str]:
        """GetPreferredAllocation for one container (1.19+, if the plugin advertises it)."""
        endpoint = self._endpoint(resource_name)
        if not self.model.calls_preferred_allocation:
            raise FeatureUnavailable(f"kubelet {self.model.name} has no GetPreferredAllocation")
        if not endpoint.options.preferred_allocation_available:
            raise FeatureUnavailable(
                f"{resource_name}: the plugin does not advertise get_preferred_allocation_available"
            )
        return await endpoint.preferred_allocation(list(available), list(must_include), size)
