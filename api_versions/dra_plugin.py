"""The kubelet's DRA plugin API on the wire: requests in, per-claim answers and health out.

Pure translation between the wire of every DRA service a kubelet may pick (``v1.DRAPlugin``
1.34+, ``v1beta1.DRAPlugin`` 1.32+, 1.31's ``v1alpha3.Node``, ``v1.DRAResourceHealth`` 1.37+
and ``v1alpha1.DRAResourceHealth`` 1.34+)
and the driver's values (:class:`~value_types.claims.ClaimRef`,
:class:`~value_types.claims.ClaimResult`,
:class:`~value_types.health.DeviceHealthReport`). The claim services' messages are
field for field the same, so one translation serves all three; a field an older kubelet does
not know (v1's ``share_id``, health's ``message``) is skipped by its protobuf decoder. The two
health services have the same messages under two proto packages, so one translation serves
both as well.

Two rules from the kubelet's DRA manager (k8s.io/kubernetes ``pkg/kubelet/cm/dra/manager.go``)
shape the answers: every claim of a request must get an entry in the response map, else the
kubelet treats the call as unfinished and calls again for the missing ones; and an RPC error
makes it drop the whole answer, so a driver's trouble with one claim (or a driver bug) goes
into that claim's ``error``, never into a status code. The call is also answered before the
kubelet's deadline (45 s), so a slow API server costs a per-claim error, not the call.

Registration is the plugin watcher's ``pluginregistration.Registration`` with ``type
"DRAPlugin"``; ``endpoint`` is empty, meaning the registration socket serves the DRA services
itself (plugin manager ``operation_generator.go``, 1.30+).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Protocol

import grpc
from google.protobuf.message import Message

from api_versions import dra_services
from api_versions.dra_services import DRA_PLUGIN_TYPE, SUPPORTED_VERSIONS, DraService
from api_versions.watcher import RegistrationOutcome, plugin_registration_handlers
from api_versions.wire import WireApi, rpc_handler
from value_types.claims import ClaimRef, ClaimResult
from value_types.health import DeviceHealthReport, HealthState

log = logging.getLogger(__name__)

KUBELET_CALL_TIMEOUT = 45.0
"""What every kubelet since 1.32 gives a NodePrepareResources call; used when the call
carries no deadline."""
ANSWER_MARGIN = 3.0
"""Seconds kept between answering and the kubelet's deadline (network, serialisation)."""
MAX_ERROR = 2000
"""Longest per-claim error sent: it ends up in a pod event and the kubelet's log."""

HEALTH_ENUM = {HealthState.UNKNOWN: 0, HealthState.HEALTHY: 1, HealthState.UNHEALTHY: 2}
"""``HealthStatus`` of ``v1.DRAResourceHealth`` and ``v1alpha1.DRAResourceHealth`` alike."""

OnCall = Callable[[DraService, str], None]
"""Told the service and method of every call received (which one the kubelet picked)."""


class ClaimBackend(Protocol):
    """What the handlers need from the driver (``ClaimPreparer`` is one)."""

    async def prepare(self, claims: Sequence[ClaimRef],
                      timeout: float | None = None) -> Mapping[str, ClaimResult]: ...

    async def unprepare(self, claims: Sequence[ClaimRef],
                        timeout: float | None = None) -> Mapping[str, str]: ...


HealthSource = Callable[[], AsyncIterator[Sequence[DeviceHealthReport]]]
"""Each call opens one stream of complete device lists (``HealthBroadcaster.watch``)."""


# -- messages ------------------------------------------------------------------------------------

def claim_refs(request: Any) -> list[ClaimRef]:
    """The claims of a NodePrepareResourcesRequest or NodeUnprepareResourcesRequest of any
    served service, in request order."""
    return [ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid) for c in request.claims]


def prepare_response(wire: WireApi, claims: Sequence[ClaimRef],
                     results: Mapping[str, ClaimResult]) -> Message:
    """A NodePrepareResourcesResponse with an entry for every claim asked.

    A claim the driver gave no result for (a bug) gets an error rather than no entry: the
    kubelet then reports it instead of calling again silently."""
    response = wire.new("NodePrepareResourcesResponse")
    for ref in claims:
        entry = response.claims[ref.uid]
        result = results.get(ref.uid)
        if result is None:
            entry.error = f"claim {ref.namespace}/{ref.name} ({ref.uid}): the driver gave no answer"
            continue
        if result.error:
            entry.error = _cut(result.error)
            continue
        for device in result.devices:
            added = entry.devices.add(request_names=list(device.request_names),
                                      pool_name=device.pool, device_name=device.device,
                                      cdi_device_ids=list(device.cdi_ids))
            if device.share_id is not None and _carries_share_id(added):
                added.share_id = device.share_id
    return response


def _carries_share_id(device: Message) -> bool:
    """Whether the service's ``Device`` has ``share_id`` (v1, read by 1.35+ kubelets, which
    match it with the allocation's ``shareID``); v1beta1 and v1alpha3 have none, and a 1.34
    kubelet on v1 reads past it."""
    return "share_id" in device.DESCRIPTOR.fields_by_name


def unprepare_response(wire: WireApi, claims: Sequence[ClaimRef],
                       results: Mapping[str, str]) -> Message:
    """A NodeUnprepareResourcesResponse with an entry (empty: done) for every claim asked."""
    response = wire.new("NodeUnprepareResourcesResponse")
    for ref in claims:
        error = results.get(ref.uid)
        if error is None:
            error = f"claim {ref.namespace}/{ref.name} ({ref.uid}): the driver gave no answer"
        response.claims[ref.uid].error = _cut(error)
    return response


def health_response(reports: Sequence[DeviceHealthReport],
                    service: DraService = dra_services.HEALTH_V1) -> Message:
    """One NodeWatchResourcesResponse of health ``service``: the complete device list."""
    wire = service.load()
    response = wire.new("NodeWatchResourcesResponse")
    for report in reports:
        response.devices.add(
            device={"pool_name": report.pool, "device_name": report.device},
            health=HEALTH_ENUM[report.state], last_updated_time=report.last_updated,
            health_check_timeout_seconds=report.timeout_seconds, message=report.message)
    return response


def failed_everywhere(claims: Sequence[ClaimRef], reason: str) -> dict[str, str]:
    """The same error for every claim (the driver failed as a whole)."""
    return {ref.uid: f"claim {ref.namespace}/{ref.name} ({ref.uid}): {reason}" for ref in claims}


def _cut(text: str) -> str:
    return text if len(text) <= MAX_ERROR else text[: MAX_ERROR - 3] + "..."


def answer_within(context: grpc.aio.ServicerContext) -> float:
    """Seconds the driver may spend before answering: the call's deadline less a margin."""
    remaining = context.time_remaining()
    if remaining is None:
        remaining = KUBELET_CALL_TIMEOUT
    return remaining - ANSWER_MARGIN if remaining > 2 * ANSWER_MARGIN else remaining / 2


# -- handlers ------------------------------------------------------------------------------------

def plugin_handlers(backend: ClaimBackend, health: HealthSource | None = None,
                    on_call: OnCall | None = None) -> dict[str, grpc.RpcMethodHandler]:
    """Handlers of every claim service in ``SUPPORTED_VERSIONS`` (and of both health services
    when ``health`` is given; without it the kubelet gets UNIMPLEMENTED, as it expects from
    a driver without health), keyed by method path."""
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for service in dra_services.PLUGIN_SERVICES:
        methods = service.methods()
        wire = service.load()
        handlers[methods["NodePrepareResources"].path] = rpc_handler(
            methods["NodePrepareResources"], _prepare(service, wire, backend, on_call))
        handlers[methods["NodeUnprepareResources"].path] = rpc_handler(
            methods["NodeUnprepareResources"], _unprepare(service, wire, backend, on_call))
    if health is not None:
        for service in dra_services.HEALTH_SERVICES:
            method = service.methods()["NodeWatchResources"]
            handlers[method.path] = rpc_handler(method, _watch(service, health, on_call))
    return handlers


def _prepare(service: DraService, wire: WireApi, backend: ClaimBackend,
             on_call: OnCall | None) -> Callable[..., Any]:
    async def prepare(request: Any, context: grpc.aio.ServicerContext) -> Message:
        if on_call is not None:
            on_call(service, "NodePrepareResources")
        claims = claim_refs(request)
        try:
            results: Mapping[str, Any] = await backend.prepare(claims, answer_within(context))
        except Exception as exc:  # a driver bug: every claim says so, the server lives on
            log.exception("%s NodePrepareResources failed", service.name)
            results = {uid: ClaimResult(error=error) for uid, error in failed_everywhere(
                claims, f"internal error of the driver: {type(exc).__name__}: {exc}").items()}
        return prepare_response(wire, claims, results)

    return prepare


def _unprepare(service: DraService, wire: WireApi, backend: ClaimBackend,
               on_call: OnCall | None) -> Callable[..., Any]:
    async def unprepare(request: Any, context: grpc.aio.ServicerContext) -> Message:
        if on_call is not None:
            on_call(service, "NodeUnprepareResources")
        claims = claim_refs(request)
        try:
            results: Mapping[str, str] = await backend.unprepare(claims,
                                                                 answer_within(context))
        except Exception as exc:
            log.exception("%s NodeUnprepareResources failed", service.name)
            results = failed_everywhere(
                claims, f"internal error of the driver: {type(exc).__name__}: {exc}")
        return unprepare_response(wire, claims, results)

    return unprepare


def _watch(service: DraService, health: HealthSource,
           on_call: OnCall | None) -> Callable[..., Any]:
    async def watch(_request: Any, context: grpc.aio.ServicerContext
                    ) -> AsyncIterator[Message]:
        if on_call is not None:
            on_call(service, "NodeWatchResources")
        try:
            async for reports in health():
                yield health_response(reports, service)
        except Exception as exc:  # the kubelet opens the stream again 5 s later
            log.exception("%s NodeWatchResources failed", service.name)
            await context.abort(grpc.StatusCode.INTERNAL, f"health stream failed: {exc}")

    return watch


def registration_handlers(driver: str, on_info: Callable[[], None],
                          on_status: Callable[[RegistrationOutcome], None]
                          ) -> dict[str, grpc.RpcMethodHandler]:
    """``pluginregistration.Registration`` of a DRA driver, keyed by method path."""
    return plugin_registration_handlers(DRA_PLUGIN_TYPE, driver, SUPPORTED_VERSIONS, on_info,
                                        on_status)
