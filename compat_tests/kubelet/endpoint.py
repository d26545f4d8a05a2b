"""The kubelet's client side of one registered plugin: dial, options, stream, calls.

A kubelet keeps one of these per resource name. It dials the plugin's socket, opens exactly
one ListAndWatch stream and never reopens it: a plugin whose stream ended must register
again. Calls return plain values from ``results``; gRPC failures become PluginCallError.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from api_versions.wire import WireApi, client_call
from compat_tests.kubelet import translate
from compat_tests.kubelet.models import KubeletModel
from compat_tests.kubelet.results import ContainerAllocation, EmulatedDevice, PluginCallError

log = logging.getLogger(__name__)

PRE_START_TIMEOUT = 30.0

DeviceUpdate = Callable[["PluginEndpoint", dict[str, EmulatedDevice]], None]
StreamEnded = Callable[["PluginEndpoint", str], None]


def go_status(code: grpc.StatusCode, details: str) -> str:
    """How a Go kubelet prints a gRPC error: ``rpc error: code = NotFound desc = ...``."""
    name = "".join(part.capitalize() for part in code.name.split("_"))
    return f"rpc error: code = {name} desc = {details}"


class PluginEndpoint:
    """One connection from the kubelet to a plugin socket, for one resource name."""

    def __init__(
        self, model: KubeletModel, wire: WireApi, resource_name: str, socket_path: Path
    ) -> None:
        self.model = model
        self.wire = wire
        self.resource_name = resource_name
        self.socket_path = socket_path
        self.options = translate.PluginOptions()
        self._channel = grpc.aio.insecure_channel(f"unix:{socket_path}")
        self._methods = wire.methods("DevicePlugin")
        self._stream: Any = None
        self._stream_task: asyncio.Task[None] | None = None
        self.closed = False

    def __repr__(self) -> str:
        return f"<endpoint {self.resource_name} at {self.socket_path}>"

    async def dial(self, timeout: float) -> None:
        """Wait until the socket accepts a connection, as grpc.DialContext(WithBlock) does."""
        try:
            await asyncio.wait_for(self._channel.channel_ready(), timeout)
        except TimeoutError:
            raise PluginCallError(
                "dial", grpc.StatusCode.DEADLINE_EXCEEDED,
                f"failed to dial device plugin: context deadline exceeded ({self.socket_path})",
            ) from None

    async def _unary(self, name: str, request: Any, timeout: float | None = None) -> Any:
        method = self._methods[name]
        try:
            return await client_call(self._channel, method)(request, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise PluginCallError(method.path, exc.code(), exc.details() or "") from None

    async def fetch_options(self) -> translate.PluginOptions:
        """GetDevicePluginOptions, as 1.26+ kubelets call it while registering."""
        answer = await self._unary("GetDevicePluginOptions", self.wire.new("Empty"))
        self.options = translate.options_from_wire(self.model, answer)
        return self.options

    def start_stream(self, on_update: DeviceUpdate, on_end: StreamEnded) -> None:
        """Open the one ListAndWatch stream of this endpoint and follow it in a task."""
        call = client_call(self._channel, self._methods["ListAndWatch"])
        self._stream = call(self.wire.new("Empty"))
        self._stream_task = asyncio.create_task(
            self._follow(on_update, on_end), name=f"ListAndWatch {self.resource_name}"
        )

    async def _follow(self, on_update: DeviceUpdate, on_end: StreamEnded) -> None:
        reason = "stream closed by the plugin"
        try:
            async for response in self._stream:
                on_update(self, translate.devices_from_wire(self.model, response))
        except grpc.aio.AioRpcError as exc:
            reason = go_status(exc.code(), exc.details() or "")
        except asyncio.CancelledError:
            reason = "stream closed by the kubelet"
            raise
        finally:
            on_end(self, reason)

    async def allocate(self, device_ids: list[str]) -> ContainerAllocation:
        """Allocate for one container (no deadline, like the kubelet), then PreStart."""
        request = translate.allocate_request(self.wire, device_ids)
        answer = await self._unary("Allocate", request)
        allocation = translate.allocation_from_wire(self.model, answer)
        if self.model.supports_pre_start and self.options.pre_start_required:
            await self._unary(
                "PreStartContainer",
                self.wire.new("PreStartContainerRequest", devices_ids=device_ids),
                timeout=PRE_START_TIMEOUT,
            )
            return ContainerAllocation(
                envs=allocation.envs, devices=allocation.devices, mounts=allocation.mounts,
                annotations=allocation.annotations, cdi_devices=allocation.cdi_devices,
                pre_started=True,
            )
        return allocation

    async def preferred_allocation(
        self, available: list[str], must_include: list[str], size: int
    ) -> list[str]:
        request = translate.preferred_request(self.wire, available, must_include, size)
        return translate.preferred_from_wire(
            await self._unary("GetPreferredAllocation", request)
        )

    async def close(self) -> None:
        """Cancel the stream and close the channel; the plugin sees its stream end."""
        self.closed = True
        if self._stream is not None:
            self._stream.cancel()
        if self._stream_task is not None:
            self._stream_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._stream_task
        self._stream = None  # a live call object keeps its transport (the connection) open
        await self._channel.close()
