"""Kubernetes 1.8: one DeviceRuntimeSpec per allocated device, merged by the kubelet.

The 1.8 kubelet merges the envs of every spec into the container, so each spec carries the
same complete ``ACCELERATOR_UNITS``: whatever order the merge takes, the container sees all
its devices, and each spec carries only its own device nodes.
"""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf.message import Message

from api_versions.adapter import Adapter, Behaviour, ServedResource


class V1Alpha1(Adapter):
    name = "v1alpha1"
    register_version = "0.1"

    def allocate_behaviour(self, resource: ServedResource) -> Behaviour:
        async def allocate(request: Any, _context: grpc.aio.ServicerContext) -> Message:
            (granted,) = self.grant(resource, [list(request.devicesIDs)])
            specs = [
                self.wire.new(
                    "DeviceRuntimeSpec",
                    ID=device.id,
                    envs=dict(granted.envs),
                    mounts=self.mounts(device.mounts),
                    devices=self.device_specs(device.nodes),
                )
                for device in granted.devices
            ]
            return self.wire.new("AllocateResponse", spec=specs)

        return allocate
