"""A tiny device plugin of any generation, for testing the kubelet emulator itself.

It serves fixed devices and echoes allocations, and counts the ListAndWatch streams it
sees, so the emulator's own behaviour (one stream, newest registration wins, no reconnect)
can be checked without the real plugin.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from api_versions.wire import WireApi, client_call, rpc_handler

VERSIONS = {"v1alpha1": "0.1", "v1alpha2": "v1alpha2", "v1beta1": "v1beta1"}


class FakePlugin:
    """Serves ``devices`` on ``directory/socket_name`` with one generation's DevicePlugin."""

    def __init__(
        self,
        directory: Path,
        socket_name: str,
        generation: str,
        devices: dict[str, str] | None = None,
        *,
        numa: int | None = None,
        pre_start_required: bool = False,
        preferred_available: bool = False,
        serve_options: bool = True,
        tag: str = "fake",
    ) -> None:
        self.directory = directory
        self.socket_path = directory / socket_name
        self.wire = WireApi.load(generation)
        self.generation = generation
        self.devices = devices if devices is not None else {"a": "Healthy", "b": "Healthy"}
        self.numa = numa
        self.pre_start_required = pre_start_required
        self.preferred_available = preferred_available
        self.serve_options = serve_options
        self.tag = tag
        self.streams_opened = 0
        self.streams_active = 0
        self.pre_started: list[list[str]] = []
        self.allocations: list[list[str]] = []
        self._poke = asyncio.Event()
        self._ending = False
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        server = grpc.aio.server()
        methods = self.wire.methods("DevicePlugin")
        behaviours: dict[str, Any] = {
            "ListAndWatch": self._list_and_watch,
            "Allocate": self._allocate,
            "GetDevicePluginOptions": self._options,
            "PreStartContainer": self._pre_start,
            "GetPreferredAllocation": self._preferred,
        }
        if not self.serve_options:
            behaviours.pop("GetDevicePluginOptions")
        handlers = {
            name: rpc_handler(methods[name], fn)
            for name, fn in behaviours.items() if name in methods
        }
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            self.wire.service("DevicePlugin").full_name, handlers)])
        server.add_insecure_port(f"unix:{self.socket_path}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)
            self._server = None

    def set_devices(self, devices: dict[str, str]) -> None:
        self.devices = devices
        self._wake()

    def end_streams(self) -> None:
        """Close every open ListAndWatch stream from the plugin side."""
        self._ending = True
        self._wake()

    def _wake(self) -> None:
        poke, self._poke = self._poke, asyncio.Event()
        poke.set()

    def _device_list(self) -> Any:
        items = []
        for device_id, health in self.devices.items():
            fields: dict[str, Any] = {"ID": device_id, "health": health}
            if self.numa is not None and self.generation == "v1beta1":
                fields["topology"] = self.wire.new(
                    "TopologyInfo", nodes=[self.wire.new("NUMANode", ID=self.numa)])
            items.append(self.wire.new("Device", **fields))
        return self.wire.new("ListAndWatchResponse", devices=items)

    async def _list_and_watch(self, _request: Any, _context: Any) -> AsyncIterator[Any]:
        self.streams_opened += 1
        self.streams_active += 1
        try:
            while not self._ending:
                poke = self._poke
                yield self._device_list()
                await poke.wait()
        finally:
            self.streams_active -= 1

    async def _allocate(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        w = self.wire
        if self.generation == "v1beta1":
            ids = [list(c.devices_ids) for c in request.container_requests]
        else:
            ids = [list(request.devicesIDs)]
        unknown = [i for group in ids for i in group if i not in self.devices]
        if unknown:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown {unknown}")
        self.allocations.extend(ids)

        def parts(group: list[str]) -> dict[str, Any]:
            return {
                "envs": {"FAKE_IDS": ",".join(group), "FAKE_TAG": self.tag},
                "devices": [w.new("DeviceSpec", container_path=f"/dev/fake{i}",
                                  host_path=f"/dev/fake{i}", permissions="rw") for i in group],
                "mounts": [w.new("Mount", container_path="/opt/fake", host_path="/srv/fake",
                                 read_only=True)],
            }

        if self.generation == "v1alpha2":
            return w.new("AllocateResponse", **parts(ids[0]))
        if self.generation == "v1alpha1":
            # One runtime spec per device; the envs repeat, the kubelet merges them.
            one = parts(ids[0])
            specs = [w.new("DeviceRuntimeSpec", ID=i, envs=one["envs"],
                           devices=[one["devices"][n]], mounts=one["mounts"] if n == 0 else [])
                     for n, i in enumerate(ids[0])]
            return w.new("AllocateResponse", spec=specs)
        responses = [w.new("ContainerAllocateResponse", annotations={"fake": "yes"},
                           cdi_devices=[w.message("CDIDevice")(name="fake.com/x=1")], **parts(g))
                     for g in ids]
        return w.new("AllocateResponse", container_responses=responses)

    async def _options(self, _request: Any, _context: Any) -> Any:
        return self.wire.new(
            "DevicePluginOptions", pre_start_required=self.pre_start_required,
            get_preferred_allocation_available=self.preferred_available)

    async def _pre_start(self, request: Any, _context: Any) -> Any:
        self.pre_started.append(list(request.devices_ids))
        return self.wire.new("PreStartContainerResponse")

    async def _preferred(self, request: Any, _context: Any) -> Any:
        answers = []
        for c in request.container_requests:
            chosen = list(c.must_include_deviceIDs)
            chosen += [i for i in sorted(c.available_deviceIDs) if i not in chosen]
            answers.append(self.wire.new("ContainerPreferredAllocationResponse",
                                         deviceIDs=chosen[: c.allocation_size]))
        return self.wire.new("PreferredAllocationResponse", container_responses=answers)

    async def register(
        self,
        kubelet_socket: Path,
        *,
        generation: str | None = None,
        version: str | None = None,
        resource_name: str = "example.com/fake",
        endpoint: str | None = None,
        timeout: float = 20.0,
    ) -> None:
        """Register with ``kubelet_socket``; raises grpc.aio.AioRpcError on refusal."""
        wire = WireApi.load(generation or self.generation)
        fields: dict[str, Any] = {
            "version": version if version is not None else VERSIONS[wire.generation],
            "endpoint": endpoint if endpoint is not None else self.socket_path.name,
            "resource_name": resource_name,
        }
        if wire.generation == "v1beta1":
            fields["options"] = wire.new(
                "DevicePluginOptions", pre_start_required=self.pre_start_required,
                get_preferred_allocation_available=self.preferred_available)
        async with grpc.aio.insecure_channel(f"unix:{kubelet_socket}") as channel:
            call = client_call(channel, wire.method("Registration", "Register"))
            await call(wire.new("RegisterRequest", **fields), timeout=timeout)
