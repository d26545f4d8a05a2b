"""Prometheus metrics, off unless ``--metrics-port`` is set, and then free of cost to callers.

The recording functions below are no-ops until :func:`enable` runs; prometheus-client is
imported only then, so a plugin without metrics pays nothing in memory (the HTTP server and
TLS machinery it brings cost a few MiB of resident memory).
"""

from __future__ import annotations

import logging
from typing import Any

from plugin.model.devices import DeviceSet, Health

log = logging.getLogger(__name__)

NAMESPACE = "accelerator_device_plugin"


class _Prometheus:
    def __init__(self, address: str, port: int) -> None:
        import prometheus_client as prom

        self.devices = prom.Gauge(
            "devices", "Devices advertised, by resource and health.",
            ["resource", "health"], namespace=NAMESPACE,
        )
        self.registered = prom.Gauge(
            "registered", "1 while the resource is registered through this API generation.",
            ["resource", "generation"], namespace=NAMESPACE,
        )
        self.registrations = prom.Counter(
            "registrations", "Successful registrations with a kubelet.",
            ["resource", "generation"], namespace=NAMESPACE,
        )
        self.negotiation_failures = prom.Counter(
            "negotiation_failures", "Negotiation rounds that ended unregistered, by reason.",
            ["resource", "reason"], namespace=NAMESPACE,
        )
        self.allocations = prom.Counter(
            "allocations", "Allocate calls per container, by result.",
            ["resource", "generation", "result"], namespace=NAMESPACE,
        )
        self.server: Any
        self.server, _thread = prom.start_http_server(port, addr=address)
        log.info("metrics on http://%s:%d/metrics", address or "0.0.0.0", self.port)

    @property
    def port(self) -> int:
        return int(self.server.server_port)


_active: _Prometheus | None = None


def enable(address: str, port: int) -> int:
    """Serve /metrics on ``address:port`` (0: any free port); return the port in use."""
    global _active
    if _active is None:
        _active = _Prometheus(address, port)
    return _active.port


def devices(resource: str, snapshot: DeviceSet) -> None:
    if _active is None:
        return
    healthy = len(snapshot.healthy_ids())
    _active.devices.labels(resource, Health.HEALTHY.value).set(healthy)
    _active.devices.labels(resource, Health.UNHEALTHY.value).set(len(snapshot) - healthy)


def registered(resource: str, generation: str | None, all_generations: list[str]) -> None:
    """Record the generation now in use for ``resource`` (None: not registered)."""
    if _active is None:
        return
    for name in all_generations:
        _active.registered.labels(resource, name).set(1 if name == generation else 0)
    if generation is not None:
        _active.registrations.labels(resource, generation).inc()


def negotiation_failed(resource: str, reason: str) -> None:
    if _active is not None:
        _active.negotiation_failures.labels(resource, reason).inc()


def allocation(resource: str, generation: str, granted: bool) -> None:
    if _active is not None:
        result = "granted" if granted else "refused"
        _active.allocations.labels(resource, generation, result).inc()
