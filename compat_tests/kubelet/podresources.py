"""The kubelet's PodResources API, emulated per release, and the pods it reports on.

What the real kubelets do (kubernetes/kubernetes ``pkg/kubelet/apis/podresources/server_v1.go``
and ``pkg/features/kube_features.go``, read for this emulator; ../shared/dra-api.md section 8):

* ``v1.PodResourcesLister`` on ``<root>/pod-resources/kubelet.sock`` from 1.20; ``List`` gives
  every active pod's containers with the device-plugin devices the device manager assigned.
* ``GetAllocatableResources``: gate KubeletPodResourcesGetAllocatable, alpha 1.21, beta on
  1.23, GA 1.28. Off: the kubelet answers ``PodResources API GetAllocatableResources disabled``.
* ``Get`` (one pod): gate KubeletPodResourcesGet, alpha 1.27, beta on 1.34. Off: the kubelet
  answers ``PodResources API Get method disabled`` (an error of code Unknown).
* ``dynamic_resources`` (DRA claims per container): gate KubeletPodResourcesDynamicResources,
  alpha 1.27, beta on 1.34; before, the field stays empty.
* After a kubelet restart (an upgrade in place), the device manager restores every active
  pod's devices from ``kubelet_internal_checkpoint`` at start and ``List`` reports them at
  once, before any plugin has registered again.

The emulator keeps "what runs on the node" in :class:`NodePods`, a JSON file beside the
device manager's checkpoint in the kubelet's directory: containers keep running across a
kubelet restart, so a 1.33 kubelet's allocation is there for the 1.36 kubelet started on the
same directory. (A real kubelet keeps pod names in its pod manager, from the API server, and
only pod UIDs in its checkpoint; one file keeps the emulation simple.)
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc

from api_versions.wire import WireApi, rpc_handler

log = logging.getLogger(__name__)

GENERATION = "podresources_v1"
SERVICE = "PodResourcesLister"
PODS_FILE = "kubelet_internal_checkpoint"
"""The device manager's checkpoint file name; ``clean_directory`` spares it at every start."""
SERVED_SINCE = 20
ALLOCATABLE_SINCE = 23
GET_SINCE = 34
DYNAMIC_RESOURCES_SINCE = 34


@dataclass(frozen=True)
class PodClaimDevice:
    """One DRA device a container uses through a claim (what 1.34+ reports)."""

    claim_namespace: str
    claim_name: str
    driver: str
    pool: str
    device: str
    cdi_ids: tuple[str, ...] = ()


@dataclass
class PodContainer:
    namespace: str
    pod: str
    container: str
    devices: dict[str, list[str]] = field(default_factory=dict)
    """Resource name -> device IDs, as the device manager assigned them."""
    claims: list[PodClaimDevice] = field(default_factory=list)


class NodePods:
    """The containers running on the node and what they got: survives kubelet restarts."""

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / PODS_FILE

    def load(self) -> list[PodContainer]:
        try:
            raw = json.loads(self.path.read_text())
        except (FileNotFoundError, ValueError):
            return []
        entries = raw.get("EmulatedContainers", []) if isinstance(raw, dict) else []
        return [PodContainer(e["namespace"], e["pod"], e["container"], e.get("devices", {}),
                             [PodClaimDevice(**{**c, "cdi_ids": tuple(c.get("cdi_ids", ()))})
                              for c in e.get("claims", [])])
                for e in entries]

    def _save(self, containers: list[PodContainer]) -> None:
        body = {"Data": {"PodDeviceEntries": [
                    {"PodUID": f"{c.namespace}/{c.pod}", "ContainerName": c.container,
                     "ResourceName": name, "DeviceIDs": {"-1": ids}}
                    for c in containers for name, ids in c.devices.items()]},
                "EmulatedContainers": [asdict(c) for c in containers]}
        scratch = self.path.with_name(f".{PODS_FILE}.tmp")
        scratch.write_text(json.dumps(body, indent=1))
        os.replace(scratch, self.path)

    def add(self, container: PodContainer) -> None:
        containers = [c for c in self.load()
                      if (c.namespace, c.pod, c.container) != (container.namespace,
                                                               container.pod,
                                                               container.container)]
        self._save([*containers, container])

    def end(self, namespace: str, pod: str) -> None:
        """The pod ended: its containers and devices are gone (the device manager frees
        them, and its checkpoint no longer lists them)."""
        self._save([c for c in self.load() if (c.namespace, c.pod) != (namespace, pod)])

    def devices_in_use(self, resource_name: str) -> set[str]:
        return {i for c in self.load() for i in c.devices.get(resource_name, ())}


class PodResourcesServer:
    """``v1.PodResourcesLister`` of kubelet ``minor``, answering from ``pods``.

    ``hang``: accept connections and never answer (a kubelet stuck on a lock)."""

    def __init__(self, minor: int, socket_path: Path, pods: NodePods, *,
                 dra_enabled: bool, hang: bool = False,
                 allocatable: Callable[[], dict[str, list[str]]] = dict) -> None:
        self.minor = minor
        self.allocatable = allocatable
        """Resource name -> the healthy device IDs the device manager holds."""
        self.socket_path = Path(socket_path)
        self.pods = pods
        self.dra_enabled = dra_enabled
        self.hang = hang
        self.calls = 0
        self.wire = WireApi.load(GENERATION)
        self._server: grpc.aio.Server | None = None

    @staticmethod
    def served_by(minor: int) -> bool:
        return minor >= SERVED_SINCE

    async def start(self) -> None:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        self.socket_path.unlink(missing_ok=True)
        methods = self.wire.methods(SERVICE)
        handlers = {
            "List": rpc_handler(methods["List"], self._list),
            "GetAllocatableResources": rpc_handler(methods["GetAllocatableResources"],
                                                   self._allocatable),
            "Get": rpc_handler(methods["Get"], self._get),
        }
        server = grpc.aio.server()
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(f"{self.wire.package}.{SERVICE}", handlers),))
        server.add_insecure_port(f"unix:{self.socket_path}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(0)
        self.socket_path.unlink(missing_ok=True)

    async def _answer(self) -> None:
        self.calls += 1
        if self.hang:
            await asyncio.Event().wait()

    def _pod(self, namespace: str, name: str, containers: list[PodContainer]) -> Any:
        reports_claims = self.dra_enabled and self.minor >= DYNAMIC_RESOURCES_SINCE
        return self.wire.new("PodResources", name=name, namespace=namespace, containers=[
            self.wire.new(
                "ContainerResources", name=c.container,
                devices=[self.wire.new("ContainerDevices", resource_name=r, device_ids=ids)
                         for r, ids in sorted(c.devices.items())],
                dynamic_resources=[
                    self.wire.new("DynamicResource", claim_name=d.claim_name,
                                  claim_namespace=d.claim_namespace, claim_resources=[
                                      self.wire.new("ClaimResource", driver_name=d.driver,
                                                    pool_name=d.pool, device_name=d.device,
                                                    cdi_devices=[self.wire.new("CDIDevice",
                                                                               name=n)
                                                                 for n in d.cdi_ids])])
                    for d in c.claims] if reports_claims else [])
            for c in containers])

    def _by_pod(self) -> dict[tuple[str, str], list[PodContainer]]:
        pods: dict[tuple[str, str], list[PodContainer]] = {}
        for container in self.pods.load():
            pods.setdefault((container.namespace, container.pod), []).append(container)
        return pods

    async def _list(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._answer()
        return self.wire.new("ListPodResourcesResponse", pod_resources=[
            self._pod(ns, name, containers)
            for (ns, name), containers in sorted(self._by_pod().items())])

    async def _allocatable(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._answer()
        if self.minor < ALLOCATABLE_SINCE:
            await context.abort(grpc.StatusCode.UNKNOWN,
                                "PodResources API GetAllocatableResources disabled")
        return self.wire.new("AllocatableResourcesResponse", devices=[
            self.wire.new("ContainerDevices", resource_name=name, device_ids=ids)
            for name, ids in sorted(self.allocatable().items())])

    async def _get(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        await self._answer()
        if self.minor < GET_SINCE:
            await context.abort(grpc.StatusCode.UNKNOWN, "PodResources API Get method disabled")
        containers = self._by_pod().get((request.pod_namespace, request.pod_name))
        if containers is None:
            await context.abort(grpc.StatusCode.UNKNOWN,
                                f"pod {request.pod_name} in namespace {request.pod_namespace} "
                                "not found")
        return self.wire.new("GetPodResourcesResponse",
                             pod_resources=self._pod(request.pod_namespace, request.pod_name,
                                                     containers or []))
