"""Kubernetes 1.9: one flat AllocateResponse for all requested devices."""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf.message import Message

from api_versions.adapter import Adapter, Behaviour, ServedResource


class V1Alpha2(Adapter):
    name = "v1alpha2"
    register_version = "v1alpha2"

    def allocate_behaviour(self, resource: ServedResource) -> Behaviour:
        async def allocate(request: Any, _context: grpc.aio.ServicerContext) -> Message:
            (granted,) = self.grant(resource, [list(request.devicesIDs)])
            return self.wire.new(
                "AllocateResponse",
                envs=dict(granted.envs),
                mounts=self.mounts(granted.mounts),
                devices=self.device_specs(granted.nodes),
            )

        return allocate
