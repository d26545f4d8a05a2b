"""What the serve process tells ``kubectl describe node``: the Kubernetes Events of its Node.

``--events auto`` (the default) turns them on where the process talks to the API server
anyway (``--api dra`` or ``auto``); ``on`` also for the device plugin (which then needs
``--node-name`` and API access: the pod's service account or ``--kubeconfig``); ``off``
writes none. What is said, on the Node named by ``--node-name``:

========================  =======  ================================================
reason                    type     when
========================  =======  ================================================
``DeviceUnhealthy``       Warning  a device turns Unhealthy (or is found so at start),
                                   with the reason discovery gave
``DeviceHealthy``         Normal   an Unhealthy device is Healthy again
``ServingAPIChanged``     Normal   ``--api auto`` moves the node between the device
                                   plugin and DRA, with why
``DevicesHeldAcrossMove`` Warning  after a move, devices running containers still hold
                                   through the other API (named with their pods or
                                   claims) are kept out of the new one until released
``FunctionLoaded``        Normal   a claim's function was loaded onto a device (what,
                                   by which loader, how long, for which claim)
``FunctionLoadFailed``    Warning  loading it failed, with the step and the kernel's or
                                   tool's message
``RuntimeWithoutCDI``     Warning  ``--api dra`` serves a node whose container runtime
                                   may not apply CDI (:mod:`plugin.serving.runtime_cdi`),
                                   with why; once per runtime version
========================  =======  ================================================

And regarding a ResourceClaim, in its namespace (``kubectl describe resourceclaim``), the
audit of each function its configuration named (:mod:`plugin.serving.dra.function_audit`):
``FunctionLoaded`` (Normal), ``FunctionNotAllowed``, ``ImageDigestMismatch``,
``FunctionLoadRefused`` and ``FunctionLoadFailed`` (Warning), each naming the claim's pods,
the class, the function, the image and its digest, the node and the device.

The recording itself (aggregation, rate limit, the queue that never blocks) is
:mod:`plugin.process.events`. This module is imported only when Events are on, and the
client (plugin/serving/events_api.py, on lightkube) only at the first Event to write: a node
with nothing to say pays for neither.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from plugin.cli.config import Settings
from plugin.process.events import (
    NORMAL,
    WARNING,
    Correlator,
    EventRecorder,
    EventSink,
    Occurrence,
    Regarding,
)
from plugin.process.supervise import supervise
from value_types.devices import DeviceSet

log = logging.getLogger(__name__)

CONTROLLER = "b-com.com/accelerator-device-plugin"
"""``reportingController``: a qualified name, as the API server demands."""
UNHEALTHY = "DeviceUnhealthy"
HEALTHY = "DeviceHealthy"
API_CHANGED = "ServingAPIChanged"
HELD = "DevicesHeldAcrossMove"
LOADED = "FunctionLoaded"
LOAD_FAILED = "FunctionLoadFailed"
RUNTIME_WITHOUT_CDI = "RuntimeWithoutCDI"
HEALTH_ACTION = "CheckHealth"
API_ACTION = "ChooseServingAPI"
PROGRAM_ACTION = "LoadFunction"
CLAIM_API_VERSION = "resource.k8s.io/v1"


def health_changes(previous: DeviceSet | None, groups: Mapping[str, DeviceSet]
                   ) -> list[Occurrence]:
    """One occurrence per device whose health changed since ``previous`` (the node's last
    device set; None at start, when every Unhealthy device is worth saying)."""
    found = []
    for resource, devices in sorted(groups.items()):
        for device in devices:
            before = previous.get(device.id) if previous is not None else None
            if not device.healthy and (before is None or before.healthy):
                why = device.health_reason or "no reason given"
                found.append(Occurrence(WARNING, UNHEALTHY, HEALTH_ACTION,
                                        f"Device {device.id} of {resource} is Unhealthy: {why}"))
            elif device.healthy and before is not None and not before.healthy:
                found.append(Occurrence(NORMAL, HEALTHY, HEALTH_ACTION,
                                        f"Device {device.id} of {resource} is Healthy again"))
    return found


def api_changed(now: str, before: str, why: str) -> Occurrence:
    """``now``/``before``: how the API is named in logs ("DRA", "the device plugin")."""
    return Occurrence(NORMAL, API_CHANGED, API_ACTION,
                      f"Devices are served through {now} instead of {before}: {why}")


def devices_held(message: str) -> Occurrence:
    """``message``: the devices, who holds them and through which API."""
    return Occurrence(WARNING, HELD, API_ACTION, message)


class _LazySink:
    """The API client, imported and made at the first call."""

    def __init__(self, node: str, kubeconfig: Path | None, timeout: float) -> None:
        self._args = (node, kubeconfig, timeout)
        self._sink: EventSink | None = None

    def _made(self) -> EventSink:
        if self._sink is None:
            from plugin.serving.events_api import NodeEventSink

            self._sink = NodeEventSink(*self._args)
        return self._sink

    async def uid(self) -> str | None:
        return await self._made().uid()

    async def create(self, namespace: str, event: dict[str, Any]) -> None:
        await self._made().create(namespace, event)

    async def patch(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        await self._made().patch(namespace, name, patch)

    async def close(self) -> None:
        if self._sink is not None:
            await self._sink.close()


class NodeEvents:
    """The Node's recorder and its sending task, for the daemon."""

    def __init__(self, recorder: EventRecorder) -> None:
        self.recorder = recorder
        self._previous: DeviceSet | None = None
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def for_settings(cls, settings: Settings) -> NodeEvents:
        """The daemon asks only when ``--events`` turns them on (nothing of the client is
        imported otherwise)."""
        assert settings.node_name is not None, "settings_problem checks --node-name"
        sink = _LazySink(settings.node_name, settings.kubeconfig, settings.api_request_timeout)
        correlator = Correlator(Regarding("Node", settings.node_name), CONTROLLER,
                                f"{CONTROLLER.rsplit('/', 1)[1]}-{socket.gethostname()}")
        log.info("Kubernetes Events on node %s: on (--events %s)", settings.node_name,
                 settings.events)
        return cls(EventRecorder(correlator, sink))

    def start(self, finished: asyncio.Event) -> None:
        if self._task is None:
            self._task = asyncio.create_task(
                supervise("Kubernetes Events", self.recorder.run, finished=finished.is_set),
                name="Kubernetes Events")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def devices(self, node: DeviceSet, groups: Mapping[str, DeviceSet]) -> None:
        """The node's devices as just found (called at every published device set)."""
        for occurrence in health_changes(self._previous, groups):
            self.recorder.record(occurrence)
        self._previous = node

    def api_moved(self, now: str, before: str, why: str) -> None:
        self.recorder.record(api_changed(now, before, why))

    def held(self, message: str) -> None:
        self.recorder.record(devices_held(message))

    def about_claim(self, namespace: str, name: str, uid: str, kind: str, reason: str,
                    note: str) -> None:
        """An Event regarding ResourceClaim ``namespace/name`` (the audit of a load)."""
        self.recorder.record(Occurrence(kind, reason, PROGRAM_ACTION, note, Regarding(
            "ResourceClaim", name, CLAIM_API_VERSION, namespace, uid)))

    def runtime_without_cdi(self, message: str) -> None:
        self.recorder.record(Occurrence(WARNING, RUNTIME_WITHOUT_CDI, API_ACTION, message))

    def programmed(self, device_id: str, claim: str, kind: str, message: str) -> None:
        """A load onto ``device_id`` for ``claim`` (``kind``: FunctionLoaded or
        FunctionLoadFailed)."""
        self.recorder.record(Occurrence(NORMAL if kind == LOADED else WARNING, kind,
                                        PROGRAM_ACTION, f"Device {device_id}: {message}"))
