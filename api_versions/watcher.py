"""The plugin-watcher side of registration: what the kubelet's plugin manager asks a socket.

A plugin registering through the plugin watcher does not call the kubelet; it serves
``pluginregistration.Registration`` beside its DevicePlugin service on a socket in the
kubelet's ``plugins_registry`` directory, and the kubelet comes to it: ``GetInfo``, then (once
the device manager has validated, dialled and opened ListAndWatch) ``NotifyRegistrationStatus``
with the outcome. Only ``v1beta1`` can be registered this way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from api_versions.wire import WireApi, rpc_handler

GENERATION = "v1beta1"
"""The only device-plugin generation the device manager accepts through the watcher."""
DEVICE_PLUGIN_TYPE = "DevicePlugin"


@dataclass(frozen=True)
class RegistrationOutcome:
    registered: bool
    error: str


def registration_handlers(
    resource_name: str,
    on_info: Callable[[], None],
    on_status: Callable[[RegistrationOutcome], None],
) -> dict[str, grpc.RpcMethodHandler]:
    """Handlers of the Registration service of a device plugin, keyed by method path."""
    return plugin_registration_handlers(DEVICE_PLUGIN_TYPE, resource_name, [GENERATION],
                                        on_info, on_status)


def plugin_registration_handlers(
    plugin_type: str,
    name: str,
    supported_versions: Sequence[str],
    on_info: Callable[[], None],
    on_status: Callable[[RegistrationOutcome], None],
) -> dict[str, grpc.RpcMethodHandler]:
    """Handlers of the Registration service for any plugin type (a device plugin, a DRA
    driver), keyed by method path.

    ``endpoint`` is left empty: the kubelet then dials the socket it found, by the path it
    sees on the host, which stays right however the plugin's container mounts the directory.
    """
    wire = WireApi.load("pluginregistration")
    methods = wire.methods("Registration")
    info = wire.new("PluginInfo", type=plugin_type, name=name, endpoint="",
                    supported_versions=list(supported_versions))

    async def get_info(_request: Any, _context: grpc.aio.ServicerContext) -> Any:
        on_info()
        return info

    async def notify(request: Any, _context: grpc.aio.ServicerContext) -> Any:
        on_status(RegistrationOutcome(bool(request.plugin_registered), str(request.error)))
        return wire.new("RegistrationStatusResponse")

    return {
        methods["GetInfo"].path: rpc_handler(methods["GetInfo"], get_info),
        methods["NotifyRegistrationStatus"].path: rpc_handler(
            methods["NotifyRegistrationStatus"], notify),
    }
