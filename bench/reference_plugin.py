"""A minimal v1beta1 device plugin that does no work per call: the framework's own floor.

``python -m bench.reference_plugin DIR N [preferred]`` serves N devices on
``DIR/reference.sock`` and registers them with the kubelet on ``DIR/kubelet.sock`` (as
``example.com/reference``), so a kubelet holds its ListAndWatch stream exactly as it holds
the real plugin's. It uses Python's grpc.aio, the same gRPC stack and wire definitions as
the real plugin, and answers every call with a canned response (one env variable for
Allocate, the first IDs offered for GetPreferredAllocation). Like the simplest plugins, it
does not advertise preferred allocation, so a kubelet makes one call per container; with
``preferred`` it does, like plugins that pack NUMA nodes, and a kubelet makes two. Nothing
is validated, logged or counted. Whatever the real plugin costs beyond this reference is
ours to remove; what this costs is the language and gRPC.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from api_versions.wire import WireApi, client_call, rpc_handler


def handlers(wire: WireApi, count: int,
             preferred_available: bool = False) -> dict[str, grpc.RpcMethodHandler]:
    methods = wire.methods("DevicePlugin")
    options = table_options(wire, preferred_available)
    devices = wire.new("ListAndWatchResponse", devices=[
        wire.new("Device", ID=str(i), health="Healthy") for i in range(count)])

    async def get_options(_request: Any, _context: Any) -> Any:
        return options

    async def list_and_watch(_request: Any, _context: Any) -> AsyncIterator[Any]:
        yield devices
        await asyncio.Event().wait()

    async def preferred(request: Any, _context: Any) -> Any:
        answers = [wire.new("ContainerPreferredAllocationResponse",
                            deviceIDs=list(c.available_deviceIDs)[:c.allocation_size])
                   for c in request.container_requests]
        return wire.new("PreferredAllocationResponse", container_responses=answers)

    async def allocate(request: Any, _context: Any) -> Any:
        answers = [wire.new("ContainerAllocateResponse",
                            envs={"ACCELERATOR_UNITS": ",".join(c.devices_ids)})
                   for c in request.container_requests]
        return wire.new("AllocateResponse", container_responses=answers)

    async def pre_start(_request: Any, _context: Any) -> Any:
        return wire.new("PreStartContainerResponse")

    behaviours = {"GetDevicePluginOptions": get_options, "ListAndWatch": list_and_watch,
                  "GetPreferredAllocation": preferred, "Allocate": allocate,
                  "PreStartContainer": pre_start}
    return {methods[n].path: rpc_handler(methods[n], fn) for n, fn in behaviours.items()}


def table_options(wire: WireApi, preferred_available: bool) -> Any:
    return wire.new("DevicePluginOptions",
                    get_preferred_allocation_available=preferred_available)


SOCKET = "reference.sock"
RESOURCE = "example.com/reference"


async def serve(directory: Path, count: int, preferred_available: bool = False) -> None:
    wire = WireApi.load("v1beta1")
    server = grpc.aio.server()
    table = handlers(wire, count, preferred_available)

    class Router(grpc.GenericRpcHandler):
        def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
            return table.get(details.method)  # type: ignore[attr-defined]

    server.add_generic_rpc_handlers([Router()])
    server.add_insecure_port(f"unix://{directory / SOCKET}")
    await server.start()
    async with grpc.aio.insecure_channel(f"unix://{directory / 'kubelet.sock'}") as channel:
        register = client_call(channel, wire.method("Registration", "Register"))
        await register(wire.new("RegisterRequest", version="v1beta1", endpoint=SOCKET,
                                resource_name=RESOURCE,
                                options=table_options(wire, preferred_available)), timeout=10)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await server.stop(0)


if __name__ == "__main__":
    asyncio.run(serve(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:] == ["preferred"]))
