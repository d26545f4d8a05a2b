"""The DRA driver's socket: registration, every claim service and health, on one unix socket.

The kubelet's plugin watcher finds ``<plugins_registry>/<driver>.sock``, calls ``GetInfo``
(type ``DRAPlugin``, endpoint ``""``: this very socket), picks one of the claim services the
driver lists (each kubelet release its own way, see :mod:`api_versions.dra_services`) and
then calls that service's paths on the same socket; 1.34+ kubelets with the
ResourceHealthStatus gate also keep a NodeWatchResources stream open on it. Serving every
service on one socket means any kubelet, 1.31 to 1.37, finds what it wants and nothing needs
to be negotiated: the driver only learns which service was picked from the paths called.

The socket is handled like the device plugin's (:mod:`plugin.serving.socket_claim`): bound
under a private name and renamed into place under the directory's ``flock``, confirmed to
answer, never taken from another live process (a rolling update waits for the old pod), and
removed on stop only if it is still ours. When it disappears (a kubelet wipe, a person) it is
served again at once; the kubelet's plugin watcher then finds it and registers it again.

A stop ends the server without grace: in-flight NodePrepareResources calls are cancelled
(whatever they recorded stays recorded; the kubelet calls again) and health streams end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from api_versions import dra_plugin
from api_versions.dra_services import PLUGIN_SERVICES, DraService, Role
from api_versions.watcher import RegistrationOutcome
from plugin.process import metrics
from plugin.process.dirwatch import Change, DirectoryWatcher, DirEvent
from plugin.serving.dra.health import HealthBroadcaster
from plugin.serving.dra.prepare import ClaimPreparer
from plugin.serving.routing import GenerationRouter, identity
from plugin.serving.socket_claim import (
    MAX_UNIX_PATH,
    PathState,
    SocketHeld,
    probe,
    serve_in_place,
)

log = logging.getLogger(__name__)

SERVICE_NAMES = [s.name for s in PLUGIN_SERVICES]


@dataclass(frozen=True)
class ServiceTiming:
    """How patient the service is; defaults suit a real node, tests shorten them."""

    confirm_timeout: float = 2.0
    check_interval: float = 5.0
    """Safety-net look at the socket, for when inotify says nothing."""
    holder_poll: float = 0.25
    """How often a service waiting for another process's socket looks again."""
    retry: float = 1.0
    """Pause after failing to serve (directory not writable...)."""


class DraNodeService:
    """Serves driver ``driver``'s DRA node socket in ``registry_dir`` until :meth:`stop`."""

    def __init__(self, driver: str, registry_dir: Path, preparer: ClaimPreparer,
                 health: HealthBroadcaster | None = None, *,
                 timing: ServiceTiming | None = None, watch_directory: bool = True,
                 refusal_expected: bool = False,
                 kubelet_instance: Callable[[], object] = lambda: None) -> None:
        self.driver = driver
        self.registry_dir = Path(registry_dir)
        self.socket_path = self.registry_dir / f"{driver}.sock"
        if len(str(self.socket_path.absolute())) > MAX_UNIX_PATH:
            raise ValueError(f"{self.socket_path} is longer than a unix socket path may be "
                             f"({MAX_UNIX_PATH} bytes)")
        self.preparer = preparer
        self.health = health
        self._refusal_level = logging.INFO if refusal_expected else logging.ERROR
        """Under ``--api auto`` a kubelet without DRA saying no is an answer, not a fault."""
        self.timing = timing or ServiceTiming()
        self.registration: RegistrationOutcome | None = None
        """What the kubelet last said in NotifyRegistrationStatus (None: nothing yet)."""
        self._kubelet_instance = kubelet_instance
        self.registration_by: object = None
        """The kubelet instance (``kubelet_instance()`` then) that said it: a kubelet makes
        its ``kubelet.sock`` before its plugin watcher starts, so that is the one talking."""
        self.kubelet_service: str | None = None
        """The claim service the kubelet calls (``"v1.DRAPlugin"``...), known from its first
        call after registration."""
        self.info_calls = 0
        self._told = asyncio.Event()
        self.health_streams_opened = 0
        self._router = GenerationRouter()
        self._router.activate({
            **dra_plugin.registration_handlers(driver, self._on_info, self._on_status),
            **dra_plugin.plugin_handlers(preparer, health.watch if health else None,
                                         self._on_call)})
        self._health = health_aio.HealthServicer()
        self._server: grpc.aio.Server | None = None
        self._served: tuple[int, int, int] | None = None
        self._gone = asyncio.Event()
        self._stop = asyncio.Event()
        self._served_once = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._watcher = DirectoryWatcher() if watch_directory else None
        self._waiting_for: SocketHeld | None = None
        self._failing: str | None = None

    # -- life cycle ------------------------------------------------------------------------

    @property
    def serving(self) -> bool:
        return self._server is not None

    @property
    def waiting_for(self) -> SocketHeld | None:
        """The other live instance serving our socket path, while this one waits for it."""
        return self._waiting_for if self._server is None else None

    async def start(self) -> None:
        """Start serving in the background (returns at once; see :meth:`wait_serving`)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"DRA service {self.driver}")

    async def wait_serving(self, timeout: float | None = None) -> None:
        """Until the socket has been put in place and answered at least once."""
        await asyncio.wait_for(self._served_once.wait(), timeout)

    async def stop(self) -> None:
        """Stop: cancel in-flight calls, end health streams, remove the socket if ours.

        The preparer and the health broadcaster stay as they are: their owner may hand them
        to a new service (and closes the broadcaster when done with it)."""
        self._stop.set()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._unserve()
        if self._watcher is not None:
            self._watcher.close()
        if self.kubelet_service is not None:
            metrics.registered(self.driver, None, SERVICE_NAMES)
        log.info("DRA driver %s: stopped serving %s", self.driver, self.socket_path)

    async def _run(self) -> None:
        watching = asyncio.create_task(self._watch_directory())
        try:
            while not self._stop.is_set():
                try:
                    await self._serve()
                except SocketHeld as held:
                    if self._waiting_for is None:
                        log.warning("DRA driver %s: %s; another instance of this driver (a "
                                    "rolling update) is still running. Waiting for it to "
                                    "stop; taking over then.", self.driver, held)
                    self._waiting_for = held
                    await self._pause(self.timing.holder_poll)
                    continue
                except Exception as exc:
                    self._report(f"cannot serve on {self.socket_path}: {exc}; retrying every "
                                 f"{self.timing.retry:g} s")
                    await self._unserve()
                    await self._pause(self.timing.retry)
                    continue
                if self._failing is not None:
                    log.info("DRA driver %s: serving again after: %s", self.driver,
                             self._failing)
                    self._failing = None
                if self._waiting_for is not None:
                    log.info("DRA driver %s: took over %s from %s", self.driver,
                             self.socket_path, self._waiting_for.probe.describe())
                    self._waiting_for = None
                self._served_once.set()
                await self._hold()
                if not self._stop.is_set():
                    log.info("DRA driver %s: %s was removed (kubelet restart?); serving it "
                             "again", self.driver, self.socket_path)
                    await self._unserve()
        finally:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching

    def _report(self, problem: str) -> None:
        """An error once, not once a second while it lasts."""
        if problem != self._failing:
            log.error("DRA driver %s: %s", self.driver, problem)
        self._failing = problem

    async def _serve(self) -> None:
        self._gone.clear()
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        bound = await serve_in_place(self.socket_path, [self._router], self._health)
        self._server, self._served = bound.server, bound.served
        if bound.replaced_stale:
            log.info("DRA driver %s: replacing stale %s (nothing was serving it)",
                     self.driver, self.socket_path)
        await self._confirm()
        log.info("DRA driver %s: serving %s (claim services %s, health %s)", self.driver,
                 self.socket_path, ", ".join(SERVICE_NAMES),
                 "on" if self.health is not None else "off")

    async def _confirm(self) -> None:
        target = f"unix://{self.socket_path.absolute()}"
        async with grpc.aio.insecure_channel(target) as channel:
            await asyncio.wait_for(channel.channel_ready(), self.timing.confirm_timeout)

    async def _hold(self) -> None:
        """Until the socket is gone (or replaced) or the service stops."""
        while not self._stop.is_set():
            self.check()
            if self._gone.is_set():
                return
            await self._pause(self.timing.check_interval)

    async def _unserve(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(0)  # no grace: a stop cancels in-flight calls
        if self._served is not None and identity(self.socket_path) == self._served:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket_path)
        self._served = None

    async def _pause(self, seconds: float) -> None:
        """Sleep, cut short by a stop or by the socket going away."""
        waiters = [asyncio.create_task(self._stop.wait()),
                   asyncio.create_task(self._gone.wait())]
        try:
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    # -- the directory ---------------------------------------------------------------------

    def check(self) -> None:
        """Note whether our socket is still the file at its path (safety net, and for a
        daemon that forwards its own directory events through :meth:`on_dir_event`)."""
        if self._server is not None and identity(self.socket_path) != self._served:
            self._gone.set()
        elif self._waiting_for is not None and probe(self.socket_path).state is not \
                PathState.LIVE:
            self._gone.set()  # the other instance is gone: take over now

    def on_dir_event(self, event: DirEvent) -> None:
        if event.name == self.socket_path.name or event.change in (Change.DIRECTORY_GONE,
                                                                   Change.OVERFLOW):
            self.check()

    async def _watch_directory(self) -> None:
        watcher = self._watcher
        if watcher is None or not watcher.watch(self.registry_dir):
            return  # no inotify, or no directory yet: the safety-net check remains
        async for event in watcher.events():
            if event.change is Change.DIRECTORY_GONE:
                self.check()
                await self._pause(self.timing.retry)
                watcher.watch(self.registry_dir)
            else:
                self.on_dir_event(event)

    # -- what the kubelet tells us ---------------------------------------------------------

    def _on_info(self) -> None:
        self.info_calls += 1
        log.debug("DRA driver %s: kubelet asked GetInfo", self.driver)
        # A (new) kubelet registering: it may pick another service. Forgotten here, not at
        # NotifyRegistrationStatus, which may arrive after that kubelet's first call.
        self.kubelet_service = None

    async def verdict_of(self, instance: object, timeout: float) -> RegistrationOutcome | None:
        """What kubelet ``instance`` last said of the registration, waiting up to ``timeout``
        seconds for it to say something; None if it did not.

        Asked by instance, not for "the next word": the kubelet that starts may register the
        driver before the plugin notices that kubelet at all, and its word then is already
        here; waiting for another would wait for nothing."""
        try:
            async with asyncio.timeout(timeout):
                while self.registration is None or self.registration_by != instance:
                    self._told.clear()  # nothing from it yet; no await since the check
                    await self._told.wait()
        except TimeoutError:
            return None
        return self.registration

    def _on_status(self, outcome: RegistrationOutcome) -> None:
        self.registration = outcome
        self.registration_by = self._kubelet_instance()
        self._told.set()
        if outcome.registered:
            log.info("DRA driver %s: registered with the kubelet", self.driver)
        else:
            log.log(self._refusal_level, "DRA driver %s: the kubelet refused the "
                    "registration: %s", self.driver, outcome.error or "no reason given")

    def _on_call(self, service: DraService, method: str) -> None:
        if service.role is Role.HEALTH:
            self.health_streams_opened += 1
            log.info("DRA driver %s: kubelet opened the health stream (%s)", self.driver,
                     service.name)
            return
        if service.name != self.kubelet_service:
            log.info("DRA driver %s: kubelet calls %s (%s)", self.driver, service.name, method)
            self.kubelet_service = service.name
            metrics.registered(self.driver, service.name, SERVICE_NAMES)

    async def self_check(self, timeout: float = 2.0) -> bool:
        """A real gRPC round trip over our own socket (for the liveness heartbeat).

        Waiting for another instance to release the socket (a rolling update) is not a
        failure: there is nothing of ours to check, and failing it kept the newcomer from
        ever passing its probes, so the old instance was never stopped."""
        if self._server is None:
            return self._waiting_for is not None
        target = f"unix://{self.socket_path.absolute()}"
        try:
            async with grpc.aio.insecure_channel(target) as channel:
                reply = await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            log.warning("DRA driver %s: self-check failed: %s", self.driver, exc.code().name)
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING
