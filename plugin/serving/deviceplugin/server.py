"""One resource, one socket: serve first, then register, and start over when the kubelet does.

Lifecycle of a :class:`ResourceServer`, repeated until it is stopped:

1. bind ``<dir>/<socket>`` and confirm it answers. A stale file is removed, but a socket
   another live process answers on is never touched: the server waits, and takes the path
   over as soon as that process is gone (see :mod:`plugin.serving.socket_claim`);
2. negotiate: offer each generation newest first, switching the socket to that generation
   before offering it, because recent kubelets dial back during Register;
3. hold: serve ListAndWatch/Allocate until the kubelet restarts, which shows as our socket
   being deleted or ``kubelet.sock`` being created anew (a different file than the one we
   registered with); then tear down and go to 1, so a kubelet upgraded to another generation
   is met with a fresh negotiation and no process restart.

A round that ends unregistered (kubelet absent, refusing every generation, hanging) is retried
with a growing pause. A new ``kubelet.sock`` cuts short whatever the round is doing (a
pause, a retry back-off, a call to a dead kubelet) and starts a fresh round at once, so a
kubelet is met within milliseconds of appearing. The server never exits on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from api_versions.adapter import Adapter
from api_versions.negotiate import (
    KUBELET_SOCKET,
    NegotiationError,
    NoGenerationAccepted,
    negotiate,
)
from api_versions.retry import RetryPolicy
from api_versions.watcher import GENERATION as WATCHER_GENERATION
from api_versions.watcher import registration_handlers
from plugin.model.feed import DeviceFeed
from plugin.process import metrics
from plugin.process.dirwatch import Change, DirEvent
from plugin.serving.cdi import CdiPolicy
from plugin.serving.deviceplugin.channels import (
    Channel,
    ChannelChooser,
    FileIdentity,
    WatcherVerdict,
)
from plugin.serving.routing import GenerationRouter, identity
from plugin.serving.socket_claim import (
    PathState,
    SocketHeld,
    directory_lock,
    move_into_place,
    probe,
    staging_path,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Timing:
    """How patient the server is; defaults suit a real node, tests shorten them."""

    round_backoff_initial: float = 0.5
    round_backoff_max: float = 30.0
    confirm_timeout: float = 2.0
    stop_grace: float = 0.05
    holder_poll: float = 0.25
    """How often a server waiting for another process's socket checks that it is still live."""
    holder_reminder: float = 300.0
    """How often a server still waiting says so again (a plugin left running for hours)."""
    handover_settle: float = 0.1
    """Pause between taking over a socket and registering, so the kubelet has processed the
    previous holder's stream end first (kubelets before kubernetes#135437 drop a newer
    registration of the same resource when the older stream's end is handled after it)."""
    watcher_wait: float = 5.0
    """How long ``auto`` waits for a kubelet to register the watcher socket (its plugin
    manager reconciles every second) before registering through ``kubelet.sock``."""


class ResourceServer:
    def __init__(
        self,
        resource_name: str,
        directory: Path,
        socket_name: str,
        feed: DeviceFeed,
        candidates: Sequence[Adapter],
        policy: RetryPolicy,
        timing: Timing = Timing(),
        registration: str = "kubelet-socket",
        registry_dir: Path | None = None,
    ) -> None:
        self._resource_name = resource_name
        self.directory = directory
        self.socket_name = socket_name
        self._feed = feed
        self.candidates = list(candidates)
        self.policy = policy
        self.timing = timing
        self.generation: str | None = None
        self.registrations = 0
        self._router = GenerationRouter()
        self._health = health_aio.HealthServicer()
        self._server: grpc.aio.Server | None = None
        self._served: FileIdentity | None = None
        self._registered_with: FileIdentity | None = None
        self._restart = asyncio.Event()
        self._kubelet_appeared = asyncio.Event()
        self._socket_freed = asyncio.Event()
        self._round_target: FileIdentity | None = None
        self._waited_for: SocketHeld | None = None
        self._waiting_since = self._last_reminder = 0.0
        self._stop = asyncio.Event()
        self._chooser = ChannelChooser(registration, registry_dir,
                                       [a.name for a in self.candidates])
        self.channel = self._chooser.choose(identity(self.directory / KUBELET_SOCKET))
        self._said_no_registry = False
        self._verdict = WatcherVerdict()
        self._kubelet_changed = asyncio.Event()
        self.cdi: CdiPolicy | None = None
        """Set by the daemon with --cdi, before each device change is published."""

    # The ServedResource protocol the adapters read.
    @property
    def resource_name(self) -> str:
        return self._resource_name

    @property
    def feed(self) -> DeviceFeed:
        return self._feed

    @property
    def socket_path(self) -> Path:
        """Where this resource's socket is for the channel of the current round."""
        if self.channel is Channel.PLUGIN_WATCHER:
            assert self._chooser.registry_dir is not None
            return self._chooser.registry_dir / self.socket_name
        return self.directory / self.socket_name

    @property
    def _generation_names(self) -> list[str]:
        return [a.name for a in self.candidates]

    @property
    def serving(self) -> bool:
        return self._server is not None

    async def run(self) -> None:
        """Serve and stay registered until :meth:`stop`; survives any kubelet behaviour."""
        while not self._stop.is_set():
            self._restart.clear()
            self.channel = self._chooser.choose(identity(self.directory / KUBELET_SOCKET))
            if self.channel is Channel.PLUGIN_WATCHER:
                if not await self._registry_present():
                    continue
                self._prepare_watcher()
            try:
                await self._serve()
            except SocketHeld as held:
                await self._wait_for_holder(held)
                continue
            except Exception as exc:
                log.error("%s: cannot serve on %s: %s; retrying", self.resource_name,
                          self.socket_path, _reason(exc))
                await self._unserve()
                await self._pause(self.timing.round_backoff_max / 10)
                continue
            if self._restart.is_set():  # removed while it was being confirmed
                await self._unserve()
                log.info("%s: serving anew", self.resource_name)
                continue
            if self._waited_for is not None:
                log.info("%s: took over %s from %s", self.resource_name, self.socket_path,
                         self._waited_for.probe.describe())
                self._waited_for = None
                await self._pause(self.timing.handover_settle, wake_on_kubelet=False)
            hold = (self._be_found_and_hold if self.channel is Channel.PLUGIN_WATCHER
                    else self._register_and_hold)
            holder = asyncio.create_task(hold())
            waiters = [asyncio.create_task(self._restart.wait()),
                       asyncio.create_task(self._stop.wait())]
            try:
                await asyncio.wait([holder, *waiters], return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (holder, *waiters):
                    task.cancel()
                await asyncio.gather(holder, *waiters, return_exceptions=True)
                await self._unserve()
            if holder.done() and not holder.cancelled() and holder.exception() is not None:
                raise holder.exception()  # type: ignore[misc]
            if self._restart.is_set() and not self._stop.is_set():
                log.info("%s: serving and negotiating again", self.resource_name)

    def stop(self) -> None:
        self._stop.set()

    def stopped(self) -> bool:
        return self._stop.is_set()

    def restart(self, reason: str) -> None:
        """Serve and register anew (SIGHUP): a fresh socket, a fresh negotiation."""
        if self._server is not None and not self._restart.is_set():
            log.info("%s: %s; serving and registering again", self.resource_name, reason)
            self._restart.set()

    async def _wait_for_holder(self, held: SocketHeld) -> None:
        """Wait until the process serving our socket path is gone, without touching it."""
        now = asyncio.get_running_loop().time()
        if self._waited_for is None:
            log.warning(
                "%s: %s; another instance of this plugin (a rolling update) or the plugin it "
                "replaces is still running. Waiting for it to stop; taking over then.",
                self.resource_name, held)
            self._waiting_since = self._last_reminder = now
        elif now - self._last_reminder >= self.timing.holder_reminder:
            log.warning("%s: still waiting after %.0f s: %s", self.resource_name,
                        now - self._waiting_since, held)
            self._last_reminder = now
        self._waited_for = held
        self._socket_freed.clear()
        waiters = [asyncio.create_task(self._socket_freed.wait()),
                   asyncio.create_task(self._stop.wait())]
        try:
            await asyncio.wait(waiters, timeout=self.timing.holder_poll,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waiters:
                task.cancel()

    def on_dir_event(self, event: DirEvent) -> None:
        """React to a change in the device-plugin directory (see the module docstring)."""
        ours_deleted = event.name == self.socket_name and event.change is Change.DELETED
        if ours_deleted:
            self._socket_freed.set()
        kubelet_created = event.name == KUBELET_SOCKET and event.change is Change.CREATED
        if event.change in (Change.DIRECTORY_GONE, Change.OVERFLOW) or ours_deleted \
                or kubelet_created:
            self.check()

    def check(self) -> None:
        """Request a restart if our socket is gone or the kubelet socket was replaced.

        While not registered, a ``kubelet.sock`` other than the one the current round
        targets (a kubelet that started since) starts a fresh round at once.
        """
        kubelet_now = identity(self.directory / KUBELET_SOCKET)
        if self._registered_with is None and kubelet_now not in (None, self._round_target):
            self._kubelet_appeared.set()
        if self._server is None or self._restart.is_set():
            return
        if identity(self.socket_path) != self._served:
            log.info("%s: socket %s was removed (kubelet restart?)", self.resource_name,
                     self.socket_path)
            self._restart.set()
            return
        if self._registered_with is not None:
            current = kubelet_now
            if current is not None and current != self._registered_with:
                if self.channel is Channel.PLUGIN_WATCHER:
                    # The new kubelet finds the watcher socket by itself.
                    self._registered_with = None
                    self._kubelet_changed.set()
                    return
                log.info("%s: %s was created anew (kubelet restart?)", self.resource_name,
                         KUBELET_SOCKET)
                self._restart.set()

    async def self_check(self, timeout: float = 2.0) -> bool:
        """A real gRPC round trip over our own socket: what the liveness heartbeat needs."""
        if self._server is None:
            return True
        target = f"unix://{self.socket_path.absolute()}"
        try:
            async with grpc.aio.insecure_channel(target) as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            log.warning("%s: self-check failed: %s", self.resource_name, exc.code().name)
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    async def _serve(self) -> None:
        if self.channel is Channel.KUBELET_SOCKET:
            self.directory.mkdir(parents=True, exist_ok=True)
        async with directory_lock(self.socket_path.parent):
            found = probe(self.socket_path)
            if found.state is PathState.LIVE:
                raise SocketHeld(self.socket_path, found)
            self._check_other_channel()
            if found.state is PathState.STALE:
                log.info("%s: replacing stale %s (nothing was serving it)", self.resource_name,
                         self.socket_path)
            staged = staging_path(self.socket_path)
            server = grpc.aio.server()
            server.add_generic_rpc_handlers([self._router])
            health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
            server.add_insecure_port(f"unix://{staged.absolute()}")
            await server.start()
            self._server = server
            move_into_place(staged, self.socket_path)
            self._served = identity(self.socket_path)
        await self._confirm()
        log.debug("%s: serving on %s", self.resource_name, self.socket_path)

    async def _confirm(self) -> None:
        """Wait until the socket just put in place answers, or until a restart is asked for.

        A kubelet starting up wipes the directory, and may do so right after our socket was
        moved into place: the dial then cannot succeed, and waiting out the timeout would
        only delay serving anew (and log an error) for nothing. The removal is seen as a
        directory event, which asks for a restart; that ends the wait at once.
        """
        target = f"unix://{self.socket_path.absolute()}"
        async with grpc.aio.insecure_channel(target) as channel:
            ready = asyncio.ensure_future(channel.channel_ready())
            restart = asyncio.ensure_future(self._restart.wait())
            try:
                done, _ = await asyncio.wait({ready, restart}, timeout=self.timing.confirm_timeout,
                                             return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in (ready, restart):
                    waiter.cancel()
                await asyncio.gather(ready, restart, return_exceptions=True)
        if ready not in done and restart not in done:
            raise TimeoutError(f"{self.socket_path} did not answer within "
                               f"{self.timing.confirm_timeout:g} s")

    def _check_other_channel(self) -> None:
        """One resource, one channel, even across instances: during a rollout between
        versions (or settings) that register differently, the newcomer waits while the
        other channel's socket of the same name is live, as it waits for its own path. A
        stale one (a killed instance) is removed, so no kubelet registers a dead socket."""
        registry = self._chooser.registry_dir
        if registry is None:
            return
        other = (self.directory if self.channel is Channel.PLUGIN_WATCHER else registry) \
            / self.socket_name
        found = probe(other)
        if found.state is PathState.LIVE:
            raise SocketHeld(other, found)
        if found.state is PathState.STALE:
            log.info("%s: removing stale %s (nothing was serving it)", self.resource_name, other)
            with contextlib.suppress(OSError):
                os.unlink(other)

    async def _unserve(self) -> None:
        server, self._server = self._server, None
        self._registered_with = None
        if self.generation is not None:
            metrics.registered(self.resource_name, None, self._generation_names)
        self.generation = None
        if server is not None:
            await server.stop(self.timing.stop_grace)
        if self._served is not None and identity(self.socket_path) == self._served:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket_path)
        self._served = None

    async def _register_and_hold(self) -> None:
        pause = self.timing.round_backoff_initial
        while True:
            adapter = await self._round()
            if isinstance(adapter, NegotiationError):
                metrics.negotiation_failed(self.resource_name, type(adapter).__name__)
                self._report(adapter, pause)
                await self._pause(pause)
                pause = min(pause * 2, self.timing.round_backoff_max)
                continue
            if adapter is None:  # a new kubelet: it may be one for the other channel
                if self._chooser.choose(identity(self.directory / KUBELET_SOCKET)) \
                        is not self.channel:
                    self._restart.set()
                    return
                pause = self.timing.round_backoff_initial
                continue
            self._now_registered(adapter)
            await self._hold_terms(adapter, adapter.registration_terms(self))
            return

    def _now_registered(self, adapter: Adapter) -> None:
        self.generation = adapter.name
        self.registrations += 1
        metrics.registered(self.resource_name, adapter.name, self._generation_names)

    async def _registry_present(self) -> bool:
        """Whether the watcher directory exists; if not, say so once and wait a while.

        The kubelet creates it at start (1.13+): it is missing before the first kubelet
        start, on an older kubelet, or when the pod does not mount it.
        """
        registry = self.socket_path.parent
        if registry.is_dir():
            self._said_no_registry = False
            return True
        if not self._said_no_registry:
            self._said_no_registry = True
            log.warning("%s: %s does not exist (kubelet not started yet, older than 1.13, or "
                        "the directory is not mounted); registering once it appears",
                        self.resource_name, registry)
        await self._pause(self.timing.round_backoff_max / 10)
        return False

    def _watcher_adapter(self) -> Adapter:
        return next(a for a in self.candidates if a.name == WATCHER_GENERATION)

    def _prepare_watcher(self) -> None:
        """Answer GetInfo before the socket appears: a kubelet may call the moment it does."""
        self._verdict.forget()
        self._router.activate({**self._watcher_adapter().handlers(self), **registration_handlers(
            self.resource_name, self._verdict.on_info, self._verdict.on_status)})

    async def _be_found_and_hold(self) -> None:
        """The watcher channel: serve, let the kubelet register us, stay registered.

        A kubelet restart needs nothing from us (the new kubelet finds the socket); under
        ``auto`` a kubelet that refuses or never calls is sent to ``kubelet.sock`` instead.
        """
        adapter = self._watcher_adapter()
        log.info("%s: serving on %s for the kubelet's plugin watcher", self.resource_name,
                 self.socket_path)
        while True:
            kubelet = identity(self.directory / KUBELET_SOCKET)
            self._kubelet_changed.clear()
            wait = self.timing.watcher_wait if self._chooser.falls_back else None
            outcome = await self._verdict.wait(wait)
            if outcome is None or not outcome.registered:
                why = (f"the kubelet refused it: {outcome.error}" if outcome is not None
                       else f"no kubelet called it within {wait:g} s")
                if self._chooser.falls_back:
                    log.warning("%s: plugin-watcher registration failed (%s); registering "
                                "through %s instead", self.resource_name, why, KUBELET_SOCKET)
                    self._chooser.declined(kubelet)
                    self._restart.set()
                    return
                log.error("%s: plugin-watcher registration failed (%s); waiting for the "
                          "kubelet to try again", self.resource_name, why)
                continue
            self._registered_with = identity(self.directory / KUBELET_SOCKET)
            self._now_registered(adapter)
            log.info("registered %s through the plugin watcher (%s)", self.resource_name,
                     adapter.name)
            terms = asyncio.create_task(self._hold_terms(adapter, adapter.registration_terms(self)))
            changed = asyncio.create_task(self._kubelet_changed.wait())
            try:
                await asyncio.wait([terms, changed], return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (terms, changed):
                    task.cancel()
                await asyncio.gather(terms, changed, return_exceptions=True)
            if not changed.done() or changed.cancelled():
                return
            log.info("%s: the kubelet restarted; waiting for it to find %s", self.resource_name,
                     self.socket_path)
            self.generation = None
            self._verdict.forget()

    async def _hold_terms(self, adapter: Adapter, registered: object) -> None:
        """Stay registered; register anew when what the kubelet was told no longer holds.

        The kubelet reads a plugin's options once, at registration: when the devices change
        what they should say (topology appearing makes preferred allocation worth a call),
        the only way to tell it is to register again.
        """
        async for _devices in self._feed.subscribe():
            if adapter.registration_terms(self) != registered:
                self.restart("the devices changed what registration tells the kubelet "
                             "(preferred allocation)")
                break
        await self._stop.wait()

    async def _round(self) -> Adapter | NegotiationError | None:
        """One negotiation round: the adapter, why it failed, or None if a kubelet came.

        The round is abandoned the moment a different ``kubelet.sock`` appears: whatever it
        was doing (a back-off between retries, a Register to a kubelet that has just died)
        can only delay meeting the new kubelet.
        """
        self._round_target = identity(self.directory / KUBELET_SOCKET)
        self._kubelet_appeared.clear()
        attempt = asyncio.create_task(negotiate(
            self.directory, self.candidates, self, self.socket_name,
            self.policy, before_attempt=self._offer,
        ))
        appeared = asyncio.create_task(self._kubelet_appeared.wait())
        try:
            await asyncio.wait([attempt, appeared], return_when=asyncio.FIRST_COMPLETED)
        finally:
            appeared.cancel()
            if not attempt.done():
                attempt.cancel()
            await asyncio.gather(attempt, appeared, return_exceptions=True)
        if attempt.cancelled():
            log.info("%s: a new kubelet.sock appeared; negotiating with it at once",
                     self.resource_name)
            return None
        failure = attempt.exception()
        if failure is None:
            now = identity(self.directory / KUBELET_SOCKET)
            if now is not None and now != self._round_target:
                # Replaced as Register returned: its directory event came during the round
                # and was spent on it, so nothing else would tell us before the safety net.
                log.info("%s: kubelet.sock was replaced as Register returned; negotiating "
                         "with the new kubelet at once", self.resource_name)
                return None
            self._registered_with = self._round_target
            return attempt.result()
        if not isinstance(failure, NegotiationError):
            raise failure
        return failure

    def _offer(self, adapter: Adapter) -> None:
        self._router.activate(adapter.handlers(self))

    def _report(self, failure: NegotiationError, pause: float) -> None:
        tried = ", ".join(a.name for a in self.candidates)
        level = logging.ERROR if isinstance(failure, NoGenerationAccepted) else logging.WARNING
        log.log(level, "%s: not registered (tried %s): %s; next round in %.1fs, or at once "
                "when a new kubelet.sock appears", self.resource_name, tried, failure, pause)

    async def _pause(self, seconds: float, wake_on_kubelet: bool = True) -> None:
        """Sleep ``seconds`` (with a little jitter), cut short by a new kubelet or a stop."""
        waiters = [asyncio.create_task(self._stop.wait())]
        if wake_on_kubelet:
            waiters.append(asyncio.create_task(self._kubelet_appeared.wait()))
        try:
            await asyncio.wait(waiters, timeout=seconds * random.uniform(0.9, 1.1),
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waiters:
                task.cancel()


def _reason(exc: BaseException) -> str:
    """One line for a failure to serve: the OS error text, or the exception itself."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror} ({exc.filename or exc.__class__.__name__})"
    return f"{type(exc).__name__}: {exc}"
