"""Kubernetes 1.10 and later: per-container Allocate, options, topology, preferred allocation."""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf.message import Message

from api_versions.adapter import Adapter, Behaviour, ServedResource
from value_types.devices import MAX_NUMA_NODES, Device


class V1Beta1(Adapter):
    name = "v1beta1"
    register_version = "v1beta1"

    #: PreStartContainer would only add a 30 s-bounded call per container for nothing: FPGA
    #: ports need no reset before use.
    pre_start_required = False

    def options(self, resource: ServedResource) -> Message:
        """Preferred allocation is advertised only where it can change the kubelet's choice
        (NUMA packing); elsewhere it would cost every container a call for nothing."""
        return self.wire.new(
            "DevicePluginOptions",
            pre_start_required=self.pre_start_required,
            get_preferred_allocation_available=resource.allocator.preference_matters(
                resource.feed.current),
        )

    def register_extras(self, resource: ServedResource) -> dict[str, Any]:
        return {"options": self.options(resource)}

    def registration_terms(self, resource: ServedResource) -> object:
        return self.options(resource).SerializeToString(deterministic=True)

    def device_message(self, device: Device) -> Message:
        """The Device with its NUMA node; a node no kernel can have raises ValueError."""
        message = super().device_message(device)
        numa = device.numa_node
        if numa is not None:
            if type(numa) is not int or not 0 <= numa < MAX_NUMA_NODES:
                raise ValueError(f"NUMA node {numa!r:.40} is outside 0..{MAX_NUMA_NODES - 1}")
            topology = self.wire.new("TopologyInfo", nodes=[self.wire.new("NUMANode", ID=numa)])
            message.topology.CopyFrom(topology)
        return message

    def behaviours(self, resource: ServedResource) -> dict[str, Behaviour]:
        async def get_options(_request: Message, _context: grpc.aio.ServicerContext) -> Message:
            return self.options(resource)

        async def preferred(request: Any, _context: grpc.aio.ServicerContext) -> Message:
            devices = resource.feed.current
            allocator = resource.allocator
            answers = [
                self.wire.new(
                    "ContainerPreferredAllocationResponse",
                    deviceIDs=allocator.preferred(
                        devices,
                        list(c.available_deviceIDs),
                        list(c.must_include_deviceIDs),
                        c.allocation_size,
                    ),
                )
                for c in request.container_requests
            ]
            return self.wire.new("PreferredAllocationResponse", container_responses=answers)

        async def pre_start(_request: Message, _context: grpc.aio.ServicerContext) -> Message:
            return self.wire.new("PreStartContainerResponse")

        return {
            **super().behaviours(resource),
            "GetDevicePluginOptions": get_options,
            "GetPreferredAllocation": preferred,
            "PreStartContainer": pre_start,
        }

    def allocate_behaviour(self, resource: ServedResource) -> Behaviour:
        async def allocate(request: Any, _context: grpc.aio.ServicerContext) -> Message:
            containers = [list(c.devices_ids) for c in request.container_requests]
            granted = self.grant(resource, containers)
            cdi = resource.cdi
            return self.wire.new(
                "AllocateResponse",
                container_responses=[
                    self.wire.new(
                        "ContainerAllocateResponse",
                        envs=dict(a.envs),
                        mounts=self.mounts(a.mounts),
                        devices=self.device_specs(a.nodes)
                        if cdi is None or cdi.device_specs else [],
                        cdi_devices=[] if cdi is None else [
                            self.wire.new("CDIDevice", name=n)
                            for n in cdi.qualified(a.device_ids)],
                    )
                    for a in granted
                ],
            )

        return allocate
