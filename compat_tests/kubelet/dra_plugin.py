"""The kubelet's client side of one registered DRA plugin instance: calls and the health stream.

One per (driver, endpoint). It speaks the service the kubelet picked at registration
(``v1.DRAPlugin``, ``v1beta1.DRAPlugin`` or 1.31's ``/v1alpha3.Node``), gives every call the
kubelet's 45 s deadline, and, when the ResourceHealthStatus gate is on, keeps a
NodeWatchResources stream open on the same connection (on the health service the release
picked: v1alpha1 for 1.34-1.36, v1 or v1alpha1 for 1.37+), reopening it 5 s after it ends or
fails, UNIMPLEMENTED included, as ``wait.UntilWithContext`` does upstream. Answers are turned
into plain values from ``dra_results``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import grpc

from api_versions import dra_services
from api_versions.wire import client_call
from compat_tests.kubelet.dra_models import (
    CALL_TIMEOUT,
    HEALTH_RETRY,
    HEALTH_V1ALPHA1,
    V1,
    DraModel,
)
from compat_tests.kubelet.dra_results import (
    ClaimRef,
    DeviceHealthRecord,
    DriverCall,
    HealthAttempt,
    PreparedDevice,
)
from compat_tests.kubelet.endpoint import go_status

log = logging.getLogger(__name__)

HEALTH_NAMES = {0: "Unknown", 1: "Healthy", 2: "Unhealthy"}
"""The kubelet's names for HealthStatus (UNKNOWN, HEALTHY, UNHEALTHY; anything else: Unknown)."""

HealthUpdated = Callable[["DraPluginClient", tuple[DeviceHealthRecord, ...]], None]
HealthEnded = Callable[["DraPluginClient", HealthAttempt], None]


def go_error(exc: grpc.aio.AioRpcError) -> str:
    """A failed call as a Go kubelet prints it; its own deadline reads as Go's context error."""
    if exc.code() is grpc.StatusCode.DEADLINE_EXCEEDED:
        return go_status(exc.code(), "context deadline exceeded")
    return go_status(exc.code(), exc.details() or "")


class DraPluginClient:
    """The kubelet's connection to one DRA plugin instance, on the service it picked."""

    def __init__(self, model: DraModel, driver: str, endpoint: str, service: str,
                 call_timeout: float = CALL_TIMEOUT) -> None:
        self.model = model
        self.driver = driver
        self.endpoint = endpoint
        self.service = dra_services.service_named(service)
        self.wire = self.service.load()
        self.methods = self.service.methods()
        self.call_timeout = call_timeout
        self._channel = grpc.aio.insecure_channel(f"unix:{endpoint}")
        self._health_task: asyncio.Task[None] | None = None
        self.health_service: str | None = None
        """The health service the stream is opened on, once :meth:`watch_health` ran."""

    def __repr__(self) -> str:
        return f"<DRA plugin {self.driver} at {self.endpoint} on {self.service.name}>"

    async def call(self, method_name: str, claims: list[ClaimRef]) -> tuple[Any, DriverCall]:
        """Call NodePrepareResources or NodeUnprepareResources for ``claims``.

        Returns the response (None when the call failed) and the record of the call. The
        request carries only namespace, UID and name, as the kubelet's does.
        """
        method = self.methods[method_name]
        request = method.request(claims=[
            {"namespace": c.namespace, "uid": c.uid, "name": c.name} for c in claims])
        uids = tuple(c.uid for c in claims)
        try:
            response = await client_call(self._channel, method)(
                request, timeout=self.call_timeout)
        except grpc.aio.AioRpcError as exc:
            error = go_error(exc)
            log.warning("kubelet %s: %s of %s failed: %s", self.model.name, method.path,
                        self.driver, error)
            return None, DriverCall(self.driver, self.endpoint, method.path, uids, error)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the caller's own cancellation
            # The channel was closed under the call (the driver's socket went away and the
            # kubelet deregistered it): grpc-go answers such a call with an error, Canceled
            # with ErrClientConnClosing's text, where grpc.aio cancels the awaiting task.
            error = "rpc error: code = Canceled desc = grpc: the client connection is closing"
            log.warning("kubelet %s: %s of %s failed: %s", self.model.name, method.path,
                        self.driver, error)
            return None, DriverCall(self.driver, self.endpoint, method.path, uids, error)
        return response, DriverCall(self.driver, self.endpoint, method.path, uids)

    def devices(self, entry: Any) -> tuple[PreparedDevice, ...]:
        """The devices of one NodePrepareResourceResponse, as this kubelet reads them."""
        reads_share = self.model.reads_share_id and self.service.name == V1
        return tuple(
            PreparedDevice(
                request_names=tuple(d.request_names), pool_name=d.pool_name,
                device_name=d.device_name, cdi_device_ids=tuple(d.cdi_device_ids),
                share_id=d.share_id if reads_share and d.HasField("share_id") else None,
            )
            for d in entry.devices
        )

    # -- health ---------------------------------------------------------------------------------

    def watch_health(self, on_update: HealthUpdated, on_end: HealthEnded,
                     retry_period: float = HEALTH_RETRY,
                     service: str = HEALTH_V1ALPHA1) -> None:
        """Keep a NodeWatchResources stream of health ``service`` open until :meth:`close`."""
        self.health_service = service
        self._health_task = asyncio.create_task(
            self._health_loop(on_update, on_end, retry_period),
            name=f"NodeWatchResources {self.driver} {self.endpoint}")

    async def _health_loop(self, on_update: HealthUpdated, on_end: HealthEnded,
                           retry_period: float) -> None:
        service = self.health_service or HEALTH_V1ALPHA1
        method = dra_services.service_named(service).methods()["NodeWatchResources"]
        request = method.request()
        while True:
            messages = 0
            stream = client_call(self._channel, method)(request)
            try:
                async for response in stream:
                    messages += 1
                    on_update(self, self.health_records(response))
                attempt = HealthAttempt(self.driver, self.endpoint, messages, "EOF",
                                        service=service)
            except grpc.aio.AioRpcError as exc:
                attempt = HealthAttempt(self.driver, self.endpoint, messages, go_error(exc),
                                        exc.code().name, service)
            except asyncio.CancelledError:
                stream.cancel()
                on_end(self, HealthAttempt(self.driver, self.endpoint, messages, "cancelled",
                                           service=service))
                raise
            log.info("kubelet %s: health stream of %s at %s ended (%s); again in %.1f s",
                     self.model.name, self.driver, self.endpoint, attempt.ended, retry_period)
            on_end(self, attempt)
            await asyncio.sleep(retry_period)

    def health_records(self, response: Any) -> tuple[DeviceHealthRecord, ...]:
        return tuple(
            DeviceHealthRecord(
                pool_name=d.device.pool_name, device_name=d.device.device_name,
                health=HEALTH_NAMES.get(d.health, "Unknown"), last_updated=d.last_updated_time,
                timeout_seconds=(d.health_check_timeout_seconds
                                 if self.model.reads_health_timeout else None),
                message=d.message if self.model.reads_health_message else None,
            )
            for d in response.devices
        )

    async def close(self) -> None:
        task, self._health_task = self._health_task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            except Exception:  # the loop's own failure must not stop the close
                log.exception("kubelet %s: health stream of %s", self.model.name, self.driver)
        await self._channel.close()
