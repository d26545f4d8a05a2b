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

Steps 1 and the tear-down are :mod:`~plugin.serving.deviceplugin.socket`; step 2 and its
hold are :mod:`~plugin.serving.deviceplugin.kubelet_socket`, or, where the kubelet's plugin
watcher registers the socket instead, :mod:`~plugin.serving.deviceplugin.watcher_hold`. This
module runs the loop over them and reacts to the kubelet's directory. The server never exits
on its own.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import grpc
from grpc_health.v1.health import aio as health_aio

from api_versions.adapter import Adapter
from api_versions.negotiate import KUBELET_SOCKET
from api_versions.retry import RetryPolicy
from plugin.model.feed import DeviceFeed
from plugin.model.replicas import Replicas, replicas_of
from plugin.process import metrics
from plugin.process.dirwatch import Change, DirEvent
from plugin.serving.cdi import CdiPolicy
from plugin.serving.deviceplugin.allocator import allocator_for
from plugin.serving.deviceplugin.channels import (
    Channel,
    ChannelChooser,
    WatcherVerdict,
)
from plugin.serving.deviceplugin.kubelet_socket import KubeletSocketChannel
from plugin.serving.deviceplugin.socket import SocketLifecycle
from plugin.serving.deviceplugin.timing import Timing
from plugin.serving.deviceplugin.watcher_hold import WatcherChannel
from plugin.serving.routing import FileIdentity, GenerationRouter, identity
from plugin.serving.socket_claim import SocketHeld

log = logging.getLogger(__name__)

Gate = Callable[[], Awaitable[bool]]
"""Asked before each round: may the device plugin serve the kubelet now there (``--api
auto``: not before the node's API is decided for that kubelet, and not if it is DRA)."""

_PATIENT = Timing()
"""A real node's patience (the default; a frozen value, so one instance serves all)."""


class ResourceServer(SocketLifecycle, KubeletSocketChannel, WatcherChannel):
    """Keeps one resource served and registered with whichever kubelet is on the node."""

    def __init__(
        self,
        resource_name: str,
        directory: Path,
        socket_name: str,
        feed: DeviceFeed,
        candidates: Sequence[Adapter],
        policy: RetryPolicy,
        timing: Timing = _PATIENT,
        registration: str = "kubelet-socket",
        registry_dir: Path | None = None,
        gate: Gate | None = None,
        replicas: Replicas = (),
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
        self._holder_in_order = False
        self._bound_at = ""
        self._replaced_stale = False
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
        count = replicas_of(replicas, resource_name)
        self.allocator = allocator_for(resource_name, count)
        """The device model's rules the adapters apply to the IDs ListAndWatch sends, to
        Allocate and to preferred allocation (``--replicas``: several IDs per device)."""
        if count > 1:
            log.info("%s: each device advertised %d times, as <device ID>::0..%d (--replicas)",
                     resource_name, count, count - 1)
        self._gate = gate

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
            if self._gate is not None and not await self._gate_opens():
                # This kubelet gets the node through DRA: the daemon withdraws this server.
                await self._pause(self.timing.round_backoff_max)
                continue
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
            if self._stop.is_set():  # stopped while the socket was being put in place
                await self._unserve()
                break
            if self._restart.is_set():  # removed while it was being confirmed
                await self._unserve()
                log.info("%s: serving anew", self.resource_name)
                continue
            if self._waited_for is not None:
                at_once = self._holder_in_order and not self._replaced_stale
                log.info("%s: took over %s from %s; registering %s", self.resource_name,
                         self.socket_path, self._waited_for.probe.describe(),
                         "at once (the kubelet has handled its stream's end)" if at_once
                         else "after a pause (the kubelet may not have handled its end yet)")
                self._waited_for = None
                if not at_once:
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

    async def _gate_opens(self) -> bool:
        """The gate's answer, or False as soon as the server is stopped while it waits."""
        assert self._gate is not None
        answer = asyncio.ensure_future(self._gate())
        stopped = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({answer, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in (answer, stopped):
                waiter.cancel()
            await asyncio.gather(answer, stopped, return_exceptions=True)
        return not answer.cancelled() and answer.exception() is None and answer.result()

    def stop(self) -> None:
        self._stop.set()

    def stopped(self) -> bool:
        return self._stop.is_set()

    def restart(self, reason: str) -> None:
        """Serve and register anew (SIGHUP): a fresh socket, a fresh negotiation."""
        if self._server is not None and not self._restart.is_set():
            log.info("%s: %s; serving and registering again", self.resource_name, reason)
            self._restart.set()

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

    def readiness(self) -> tuple[bool, str]:
        """Whether the kubelet running now holds this resource, and in a few words why.

        Registered with a kubelet that has since gone (its ``kubelet.sock`` removed or made
        anew) is not ready. Waiting for another live instance to release the socket is: that
        instance serves the node meanwhile, and during a rolling update with surge the old
        pod is only stopped once the new one is ready.
        """
        if self._waited_for is not None and self._server is None:
            return True, (f"{self._waited_for}; this instance takes over when it stops")
        if self.generation is None:
            return False, "not registered with the kubelet"
        if identity(self.directory / KUBELET_SOCKET) != self._registered_with:
            return False, (f"registered through {self.generation} with a kubelet that is "
                           "gone; waiting for the next one")
        return True, f"registered through {self.generation}"

    def _now_registered(self, adapter: Adapter) -> None:
        self.generation = adapter.name
        self.registrations += 1
        metrics.registered(self.resource_name, adapter.name, self._generation_names)

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
