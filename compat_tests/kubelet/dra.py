"""A kubelet's DRA manager, emulated for one Kubernetes release (1.31 .. 1.38) at a time.

The real kubelet has two halves this mirrors: the handler the plugin manager hands every
``DRAPlugin`` socket to (validate the driver's ``supported_versions``, pick a service, keep
the driver's plugin instances, wipe its slices when the last one goes), and the manager that
prepares and unprepares claims and follows device health (``pkg/kubelet/cm/dra``). Tests of
a DRA driver run it inside :class:`~compat_tests.kubelet.emulator.KubeletEmulator` (which
wires it to the plugin watcher) and assert on what it recorded: registrations, the service
picked, per-claim answers, health messages, slice wipes. Version differences come from
``dra_models``; the calls from ``dra_plugin`` and ``dra_claims``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from compat_tests.kubelet import dra_claims
from compat_tests.kubelet.dra_models import (
    CALL_TIMEOUT,
    FIRST_DRA_MINOR,
    HEALTH_RETRY,
    Instances,
    load_dra_model,
)
from compat_tests.kubelet.dra_plugin import DraPluginClient
from compat_tests.kubelet.dra_results import (
    ClaimCheckpoint,
    ClaimRef,
    ClaimsOutcome,
    DeviceHealthRecord,
    DraRegistration,
    HealthAttempt,
    HealthUpdate,
    SliceWipe,
)
from compat_tests.kubelet.slices import WipeDriverSlices, WipeSlices

log = logging.getLogger(__name__)

DRA_PLUGIN_TYPE = "DRAPlugin"
WIPE_BACKOFF_CAP = 300.0
"""``wait.Backoff{Duration: 1s, Factor: 2, Jitter: 0.2, Cap: 5m}`` around DeleteCollection."""
POLL_INTERVAL = 0.1


@dataclass
class DraConfig:
    """How the emulated kubelet runs DRA. Hand the same object to the next kubelet to
    restart it: ``checkpoint`` plays the kubelet's DRA checkpoint file, which survives."""

    enabled: bool | None = None
    """The DynamicResourceAllocation gate; None: the release's default (on from 1.34)."""
    resource_health: bool | None = None
    """The ResourceHealthStatus gate; None: the release's default (on from 1.36)."""
    node_name: str = "node-1"
    wipe_slices: WipeSlices | None = None
    """``await wipe_slices(node_name)`` at every start; None: no API server (nothing wiped)."""
    wipe_driver_slices: WipeDriverSlices | None = None
    """``await wipe_driver_slices(node_name, driver)`` when a driver's last plugin is gone."""
    call_timeout: float = CALL_TIMEOUT
    health_retry_period: float = HEALTH_RETRY
    wipe_retry_initial: float = 1.0
    driver_wipe_delay: float | None = None
    """None: the release's delay (none for 1.31-1.32, 30 s from 1.33)."""
    checkpoint: ClaimCheckpoint = field(default_factory=ClaimCheckpoint)


def dra_gate(model: str, config: DraConfig) -> bool:
    """Whether kubelet ``model`` runs DRA: the DynamicResourceAllocation gate as configured,
    or the release's default (on from 1.34). ValueError if asked of a kubelet before 1.31."""
    minor = int(model.split(".")[1])
    if minor < FIRST_DRA_MINOR:
        if config.enabled:
            raise ValueError(f"kubelet {model} has no DRA this emulator speaks (1.31+)")
        return False
    return config.enabled if config.enabled is not None else load_dra_model(model).dra_gate_default


@dataclass
class _Instance:
    registration: DraRegistration
    client: DraPluginClient


class DraManager:
    """The DRA side of one emulated kubelet; also the plugin watcher's ``DRAPlugin`` handler."""

    plugin_type = DRA_PLUGIN_TYPE

    def __init__(self, model: str, config: DraConfig | None = None) -> None:
        self.model = load_dra_model(model)
        self.config = config if config is not None else DraConfig()
        self.health_enabled = self.model.health_enabled(self.config.resource_health)
        self.wipe_delay = (self.model.driver_wipe_delay if self.config.driver_wipe_delay is None
                           else self.config.driver_wipe_delay)
        self.registrations: list[DraRegistration] = []
        """Every registration the handler decided on, accepted or refused, in order."""
        self.deregistrations: list[tuple[str, str]] = []
        """(driver, endpoint) of every instance removed because its socket went away."""
        self.health_updates: list[HealthUpdate] = []
        self.health_attempts: list[HealthAttempt] = []
        self.slice_wipes: list[SliceWipe] = []
        self._store: dict[str, list[_Instance]] = {}
        self._health: dict[str, dict[tuple[str, str], DeviceHealthRecord]] = {}
        self._pending_wipes: dict[str, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Event()
        self.running = False

    @property
    def checkpoint(self) -> ClaimCheckpoint:
        return self.config.checkpoint

    # -- life cycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Start like the kubelet's DRA manager: wipe the node's slices in the background."""
        self.running = True
        wipe = self.config.wipe_slices
        if wipe is None:
            log.info("kubelet %s: DRA on, no API server: no ResourceSlices wiped at start",
                     self.model.name)
            return
        self._spawn(self._wipe(lambda: wipe(self.config.node_name), None))

    async def stop(self) -> None:
        """Go down with the kubelet: background work stops, connections close. The checkpoint
        (``config.checkpoint``) stays for the next kubelet."""
        self.running = False
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        instances = [i for group in self._store.values() for i in group]
        self._store.clear()
        for instance in instances:
            await instance.client.close()
        self._notify()

    # -- the plugin manager's handler -----------------------------------------------------------

    def validate(self, name: str, endpoint: str, versions: tuple[str, ...],
                 socket: str) -> str | None:
        """ValidatePlugin: the release's refusal of the driver's versions, or None."""
        choice = self.model.choose(name, versions)
        problem = None
        if choice.error is not None:
            problem = self.model.validation_error(name, endpoint, choice.error)
        elif self.model.instances is Instances.HIGHER_VERSION and choice.version is not None:
            existing = self._store.get(name)
            old = existing[-1].registration.version if existing else None
            if old is not None and not _older(old, choice.version):
                problem = self.model.lower_version_error(name, choice.version, old)
        if problem is not None:
            self._record(DraRegistration(name, endpoint, socket, versions, None, False, problem,
                                         choice.version))
        return problem

    async def register(self, name: str, endpoint: str, versions: tuple[str, ...],
                       socket: str) -> str | None:
        """RegisterPlugin: keep the instance, open its health stream; the error, or None."""
        choice = self.model.choose(name, versions)
        if choice.service is None:  # ValidatePlugin refused it already; kept for direct use
            return self.model.validation_error(name, endpoint, choice.error or "")
        instances = self._store.setdefault(name, [])
        replaced = None
        if self.model.instances is Instances.MANY:
            if any(i.registration.endpoint == endpoint for i in instances):
                problem = self.model.same_endpoint_error(name, endpoint)
                self._record(DraRegistration(name, endpoint, socket, versions, None, False,
                                             problem))
                return problem
        elif instances:
            old = instances.pop()
            replaced = old.registration.endpoint
            log.info("kubelet %s: DRA driver %s: %s replaces %s", self.model.name, name,
                     endpoint, replaced)
            self._spawn(old.client.close())
        registration = DraRegistration(name, endpoint, socket, versions, choice.service, True,
                                       None, choice.version, replaced)
        client = DraPluginClient(self.model, name, endpoint, choice.service,
                                 self.config.call_timeout)
        instances.append(_Instance(registration, client))
        pending = self._pending_wipes.pop(name, None)
        if pending is not None:
            pending.cancel()
        health = self.model.health_service(versions) if self.health_enabled else None
        if health is not None:
            client.watch_health(self._on_health, self._on_health_end,
                                self.config.health_retry_period, health)
        elif self.health_enabled:
            log.info("kubelet %s: DRA driver %s lists no health service this kubelet calls: "
                     "no health stream", self.model.name, name)
        log.info("kubelet %s: registered DRA driver %s at %s on %s", self.model.name, name,
                 endpoint, choice.service)
        self._record(registration)
        return None

    def deregister(self, name: str, endpoint: str) -> None:
        """DeRegisterPlugin: the socket went away. 1.33+ remove that endpoint's instance;
        older kubelets remove the driver's plugin whatever its endpoint."""
        instances = self._store.get(name, [])
        if self.model.deregister_by_endpoint:
            gone = [i for i in instances if i.registration.endpoint == endpoint]
        else:
            gone = instances[-1:]
        for instance in gone:
            instances.remove(instance)
            self.deregistrations.append((name, instance.registration.endpoint))
            self._spawn(instance.client.close())
            log.info("kubelet %s: deregistered DRA driver %s at %s", self.model.name, name,
                     instance.registration.endpoint)
        if gone and not instances:
            del self._store[name]
            self._schedule_driver_wipe(name)
        self._notify()

    # -- claims ---------------------------------------------------------------------------------

    async def prepare(self, claims: list[ClaimRef]) -> ClaimsOutcome:
        """NodePrepareResources for one pod's claims, exactly as the kubelet calls it."""
        outcome = await dra_claims.prepare(list(claims), self.checkpoint, self._plugin_for)
        self._notify()
        return outcome

    async def unprepare(self, claims: list[ClaimRef]) -> ClaimsOutcome:
        """NodeUnprepareResources for one pod's claims (only those the kubelet prepared)."""
        outcome = await dra_claims.unprepare(list(claims), self.checkpoint, self._plugin_for)
        self._notify()
        return outcome

    def _plugin_for(self, driver: str) -> DraPluginClient:
        instances = self._store.get(driver) if driver else None
        if not instances:
            raise dra_claims.PluginMissing(dra_claims.missing_plugin_error(driver))
        return instances[-1].client  # upstream's heuristic: the most recent instance

    # -- what tests look at ---------------------------------------------------------------------

    def endpoints(self, driver: str) -> tuple[str, ...]:
        """The registered instances of ``driver``, oldest first."""
        return tuple(i.registration.endpoint for i in self._store.get(driver, []))

    def service(self, driver: str) -> str | None:
        """The service the kubelet would call for ``driver`` now (its newest instance)."""
        instances = self._store.get(driver)
        return instances[-1].registration.service if instances else None

    def health(self, driver: str) -> dict[tuple[str, str], DeviceHealthRecord]:
        """The kubelet's health cache for ``driver``: (pool, device) -> latest record."""
        return dict(self._health.get(driver, {}))

    async def wait_until(self, condition: Callable[[], bool], timeout: float = 5.0,
                         what: str = "condition") -> None:
        """Wait (event-driven) until ``condition()`` holds; TimeoutError naming ``what``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not condition():
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"kubelet {self.model.name} (DRA): no {what} within "
                                   f"{timeout} s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(remaining, POLL_INTERVAL))

    # -- health ---------------------------------------------------------------------------------

    def _on_health(self, client: DraPluginClient, devices: tuple[DeviceHealthRecord, ...]) -> None:
        self.health_updates.append(HealthUpdate(client.driver, client.endpoint, devices,
                                                client.health_service))
        cache = self._health.setdefault(client.driver, {})
        for device in devices:
            cache[(device.pool_name, device.device_name)] = device
        log.info("kubelet %s: health of %s: %s", self.model.name, client.driver,
                 " ".join(f"{d.pool_name}/{d.device_name}={d.health}" for d in devices) or "none")
        self._notify()

    def _on_health_end(self, client: DraPluginClient, attempt: HealthAttempt) -> None:
        self.health_attempts.append(attempt)
        self._health.pop(client.driver, None)  # clearDriver when the stream exits
        self._notify()

    # -- ResourceSlice wiping -------------------------------------------------------------------

    def _schedule_driver_wipe(self, driver: str) -> None:
        wipe = self.config.wipe_driver_slices
        if wipe is None:
            return
        old = self._pending_wipes.pop(driver, None)
        if old is not None:
            old.cancel()

        async def later() -> None:
            await asyncio.sleep(self.wipe_delay)
            await self._wipe(lambda: wipe(self.config.node_name, driver), driver)

        task = self._spawn(later())
        self._pending_wipes[driver] = task
        task.add_done_callback(lambda t: self._pending_wipes.pop(driver, None)
                               if self._pending_wipes.get(driver) is t else None)

    async def _wipe(self, call: Callable[[], Awaitable[None]], driver: str | None) -> None:
        """DeleteCollection until it succeeds, backing off 1 s x2 (jitter 0.2) up to 5 min."""
        delay = self.config.wipe_retry_initial
        attempt = 1
        node = self.config.node_name
        while True:
            try:
                await call()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.slice_wipes.append(SliceWipe(node, driver, False, str(exc), attempt))
                log.warning("kubelet %s: deleting ResourceSlices of %s%s failed, retrying: %s",
                            self.model.name, node, f" for {driver}" if driver else "", exc)
                self._notify()
                await asyncio.sleep(min(delay * random.uniform(1.0, 1.2), WIPE_BACKOFF_CAP))
                delay = min(delay * 2, WIPE_BACKOFF_CAP)
                attempt += 1
                continue
            self.slice_wipes.append(SliceWipe(node, driver, True, None, attempt))
            log.info("kubelet %s: deleted ResourceSlices of node %s%s", self.model.name, node,
                     f" for driver {driver}" if driver else "")
            self._notify()
            return

    # -- plumbing -------------------------------------------------------------------------------

    def _record(self, registration: DraRegistration) -> None:
        self.registrations.append(registration)
        if not registration.accepted:
            log.warning("kubelet %s: refused DRA driver %s: %s", self.model.name,
                        registration.driver, registration.error)
        self._notify()

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _notify(self) -> None:
        event, self._changed = self._changed, asyncio.Event()
        event.set()


def _older(old: str, new: str) -> bool:
    """1.31's ``existing.LessThan(new)`` for the versions it kept."""
    return tuple(int(c) for c in old.split(".")) < tuple(int(c) for c in new.split("."))
