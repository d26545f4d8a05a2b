"""A minimal DRA driver that does only what no driver can skip: the floor for bench/dra.py.

``python -m bench.reference_dra_driver REGISTRY KUBECONFIG`` serves
``REGISTRY/reference.example.com.sock``: the plugin watcher's ``pluginregistration.Registration``
(``PluginInfo{type: "DRAPlugin", endpoint: ""}``: this very socket, as the real driver does)
and ``v1.DRAPlugin``, nothing else (a kubelet asking for health gets UNIMPLEMENTED, as from
any driver without it). For each claim of a NodePrepareResources call it does the one thing
every driver must: GET the ResourceClaim from the API server (the call carries only namespace,
name and UID), with the same client library and settings as the real driver (lightkube's
``AsyncClient``, a generic resource.k8s.io/v1 resource, a 10 s timeout), and answers with the
devices of the claim's allocation results and one canned CDI ID each. No checkpoint, no CDI
spec, no validation (driver, pool, UID, device names are not checked), no logging; unprepare
answers every claim as done at once. It uses Python's grpc.aio and the project's wire
definitions, like the real driver. What the real driver costs beyond this is its own; what
this costs is the language, gRPC and one API round trip.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

import grpc
import httpx2
from lightkube import AsyncClient, KubeConfig
from lightkube.generic_resource import create_namespaced_resource

from api_versions import dra_services
from api_versions.wire import WireApi, rpc_handler

DRIVER = "reference.example.com"
CDI_ID = "example.com/fpga=canned"
CLAIMS = create_namespaced_resource("resource.k8s.io", "v1", "ResourceClaim", "resourceclaims")


def handlers(client: AsyncClient) -> dict[str, grpc.RpcMethodHandler]:
    registration = WireApi.load("pluginregistration")
    registration_methods = registration.methods("Registration")
    info = registration.new("PluginInfo", type="DRAPlugin", name=DRIVER, endpoint="",
                            supported_versions=[dra_services.V1.name])
    wire = dra_services.V1.load()
    methods = dra_services.V1.methods()

    async def get_info(_request: Any, _context: Any) -> Any:
        return info

    async def notify(_request: Any, _context: Any) -> Any:
        return registration.new("RegistrationStatusResponse")

    async def devices_of(claim: Any) -> list[Any]:
        obj = await client.get(CLAIMS, claim.name, namespace=claim.namespace)
        results = obj["status"]["allocation"]["devices"]["results"]
        return [wire.new("Device", request_names=[r["request"]], pool_name=r["pool"],
                         device_name=r["device"], cdi_device_ids=[CDI_ID]) for r in results]

    async def prepare(request: Any, _context: Any) -> Any:
        answers = await asyncio.gather(*(devices_of(c) for c in request.claims))
        response = wire.new("NodePrepareResourcesResponse")
        for claim, devices in zip(request.claims, answers, strict=True):
            response.claims[claim.uid].devices.extend(devices)
        return response

    async def unprepare(request: Any, _context: Any) -> Any:
        response = wire.new("NodeUnprepareResourcesResponse")
        for claim in request.claims:
            response.claims[claim.uid].error = ""
        return response

    return {
        registration_methods["GetInfo"].path: rpc_handler(registration_methods["GetInfo"],
                                                          get_info),
        registration_methods["NotifyRegistrationStatus"].path: rpc_handler(
            registration_methods["NotifyRegistrationStatus"], notify),
        methods["NodePrepareResources"].path: rpc_handler(methods["NodePrepareResources"],
                                                          prepare),
        methods["NodeUnprepareResources"].path: rpc_handler(methods["NodeUnprepareResources"],
                                                            unprepare),
    }


async def serve(registry: Path, kubeconfig: Path) -> None:
    client = AsyncClient(KubeConfig.from_file(kubeconfig), timeout=httpx2.Timeout(10.0))
    table = handlers(client)

    class Router(grpc.GenericRpcHandler):
        def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
            return table.get(details.method)  # type: ignore[attr-defined]

    server = grpc.aio.server()
    server.add_generic_rpc_handlers([Router()])
    server.add_insecure_port(f"unix://{registry.absolute() / f'{DRIVER}.sock'}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await server.stop(0)
    await client.close()


if __name__ == "__main__":
    asyncio.run(serve(Path(sys.argv[1]), Path(sys.argv[2])))
