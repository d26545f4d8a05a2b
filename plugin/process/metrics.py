"""Prometheus metrics, off unless ``--metrics-port`` is set, and then free of cost to callers.

The recording functions below are no-ops until :func:`enable` runs; prometheus-client is
imported only then, so a plugin without metrics pays nothing in memory (the HTTP server and
TLS machinery it brings cost a few MiB of resident memory).
"""

from __future__ import annotations

import contextlib
import logging
import platform
from collections.abc import Callable, Sequence
from typing import Any

from plugin.version import VERSION
from value_types.devices import DeviceSet, Health

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
        self.node_api = prom.Gauge(
            "node_api", "1 for the API this node's devices are served through now (both 0 "
            "while --api auto has not decided).", ["api"], namespace=NAMESPACE,
        )
        self.dra_claims = prom.Counter(
            "dra_claims", "Claims the kubelet asked the DRA driver to prepare or unprepare, "
            "by result (error: the kubelet was answered with an error for the claim).",
            ["driver", "operation", "result"], namespace=NAMESPACE,
        )
        self.dra_prepared_claims = prom.Gauge(
            "dra_prepared_claims", "Claims prepared and not yet unprepared, as recorded in the "
            "driver's checkpoint.", ["driver"], namespace=NAMESPACE,
        )
        self.dra_slices_in_sync = prom.Gauge(
            "dra_slices_in_sync", "While the node publishes through DRA: 1 when its "
            "ResourceSlices are as the devices are, 0 while they cannot be written.",
            ["driver"], namespace=NAMESPACE,
        )
        self.dra_slice_publications = prom.Counter(
            "dra_slice_publications", "Times the node's pool was written to the API server "
            "(a new pool generation).", ["driver"], namespace=NAMESPACE,
        )
        self.dra_claim_status_writes = prom.Counter(
            "dra_claim_status_writes", "Writes of prepared claims' status.devices entries, by "
            "result (refused: 401 or 403, error: anything else that failed).",
            ["driver", "result"], namespace=NAMESPACE,
        )
        self.devices_held = prom.Gauge(
            "devices_held_by_other_api", "Devices not offered through the API the node is "
            "served through now because running containers still hold them through the "
            "other one (api: the API holding them).", ["api"], namespace=NAMESPACE,
        )
        self.dra_programming = prom.Counter(
            "dra_programming", "Devices of prepared claims that needed a function, by "
            "result: skipped (held already), loaded, failed (the load or the wait for the "
            "device to report it), refused (wrong image, not programmable, held by another "
            "claim).", ["driver", "family", "loader", "result"], namespace=NAMESPACE,
        )
        self.dra_binding = prom.Counter(
            "dra_binding", "Claims whose function was given before their pods bound "
            "(--program-at bind), by result: ready (FunctionReady set), failed "
            "(FunctionFailed set: the scheduler moves the pod), abandoned (deallocated "
            "before the answer).", ["driver", "result"], namespace=NAMESPACE,
        )
        self.dra_programming_seconds = prom.Histogram(
            "dra_programming_seconds", "Time from the decision to load a function until the "
            "device reported it, for loads that succeeded.", ["driver", "family", "loader"],
            namespace=NAMESPACE, buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300),
        )
        self.devices_quarantined = prom.Gauge(
            "devices_load_failed", "Devices reported Unhealthy because a load onto them "
            "failed, until a load succeeds.", [], namespace=NAMESPACE,
        )
        build_info = prom.Gauge(
            "build_info", "Always 1; the labels say which build runs: its version and the "
            "Python it runs on.", ["version", "python"], namespace=NAMESPACE,
        )
        build_info.labels(VERSION, platform.python_version()).set(1)
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


def follow_node_api(apis: Sequence[str], current: Callable[[], str | None]) -> None:
    """Report ``current()`` (one of ``apis``, or None while undecided) at every scrape: the
    choice has one owner, and the metric reads it rather than being told."""
    if _active is None:
        return
    for api in apis:
        _active.node_api.labels(api).set_function(lambda api=api: float(current() == api))


def dra_claims(driver: str, operation: str, ok: int, failed: int) -> None:
    if _active is None:
        return
    if ok:
        _active.dra_claims.labels(driver, operation, "ok").inc(ok)
    if failed:
        _active.dra_claims.labels(driver, operation, "error").inc(failed)


def follow_dra_prepared_claims(driver: str, count: Callable[[], int | None]) -> None:
    """Report ``count()`` at every scrape (None, before the checkpoint is read: no value)."""
    if _active is None:
        return

    def value() -> float:
        held = count()
        return float("nan") if held is None else float(held)

    _active.dra_prepared_claims.labels(driver).set_function(value)


def dra_slices(driver: str, in_sync: bool | None) -> None:
    """Whether the node's slices are as its devices are (None: the node does not publish
    through DRA now, so there is no such figure)."""
    if _active is None:
        return
    if in_sync is None:
        with contextlib.suppress(KeyError):
            _active.dra_slices_in_sync.remove(driver)
    else:
        _active.dra_slices_in_sync.labels(driver).set(1 if in_sync else 0)


def dra_slices_published(driver: str) -> None:
    """A new pool generation was written."""
    if _active is not None:
        _active.dra_slice_publications.labels(driver).inc()


def dra_claim_status_write(driver: str, result: str) -> None:
    """One write of a claim's ``status.devices`` entries: ``ok``, ``refused`` or ``error``."""
    if _active is not None:
        _active.dra_claim_status_writes.labels(driver, result).inc()


def devices_held(api: str, count: int) -> None:
    """How many devices containers still hold through ``api`` (``device-plugin`` or ``dra``)
    while the node serves through the other one."""
    if _active is not None:
        _active.devices_held.labels(api).set(count)


def dra_programming(driver: str, family: str, loader: str, result: str,
                    seconds: float) -> None:
    """One device of a prepared claim that named a function (see ``dra_programming``)."""
    if _active is not None:
        _active.dra_programming.labels(driver, family, loader, result).inc()
        if result == "loaded":
            _active.dra_programming_seconds.labels(driver, family, loader).observe(seconds)


def dra_binding(driver: str, result: str) -> None:
    """One claim answered before its pod bound (see ``dra_binding``)."""
    if _active is not None:
        _active.dra_binding.labels(driver, result).inc()


def devices_load_failed(count: int) -> None:
    """How many devices a failed load left Unhealthy now."""
    if _active is not None:
        _active.devices_quarantined.set(count)
