"""A resource's socket: bound, confirmed to answer, and removed only if it is still ours.

The kubelet dials back during Register (1.26+) and a starting kubelet wipes the directory, so
a socket is put in place whole (bound under a private name, renamed in), confirmed to answer
before anything is registered, and removed on the way out only when the file at the path is
the one this server created. A socket another live process answers on is never touched: the
server waits, and takes the path over once that process is gone (see
:mod:`plugin.serving.socket_claim`). Either registration channel runs on top of this.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from plugin.process import metrics
from plugin.serving.deviceplugin.channels import Channel, ChannelChooser
from plugin.serving.deviceplugin.handover import (
    ORDERED_HANDOVER,
    hands_over_in_order,
    kubelet_released,
)
from plugin.serving.routing import FileIdentity, GenerationRouter, identity
from plugin.serving.socket_claim import (
    PathState,
    SocketHeld,
    probe,
    serve_in_place,
)

if TYPE_CHECKING:
    from pathlib import Path

    from plugin.serving.deviceplugin.timing import Timing

log = logging.getLogger(__name__)


class SocketLifecycle:
    """The socket part of :class:`~plugin.serving.deviceplugin.server.ResourceServer`.

    A mixin rather than an object of its own because the lifecycle loop, the directory
    events and both channels read and reset the same few fields (what is served, what it
    was registered with); the server defines them, this class only names what it uses.
    """

    resource_name: str
    socket_name: str
    timing: Timing
    generation: str | None
    channel: Channel
    _router: GenerationRouter
    _health: health_aio.HealthServicer
    _server: grpc.aio.Server | None
    _served: FileIdentity | None
    _registered_with: FileIdentity | None
    _restart: asyncio.Event
    _stop: asyncio.Event
    _socket_freed: asyncio.Event
    _waited_for: SocketHeld | None
    _holder_in_order: bool
    _bound_at: str
    _replaced_stale: bool
    _waiting_since: float
    _last_reminder: float
    _chooser: ChannelChooser
    directory: Path
    socket_path: Path
    _generation_names: list[str]

    async def _wait_for_holder(self, held: SocketHeld) -> None:
        """Wait until the process serving our socket path is gone, without touching it."""
        now = asyncio.get_running_loop().time()
        if self._waited_for is None:
            self._holder_in_order = await hands_over_in_order(held.path)
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
        await self._health.set(ORDERED_HANDOVER, health_pb2.HealthCheckResponse.SERVING)
        bound = await serve_in_place(self.socket_path, [self._router], self._health,
                                     under_lock=self._check_other_channel)
        self._server, self._served = bound.server, bound.served
        self._bound_at, self._replaced_stale = bound.bound_at, bound.replaced_stale
        if bound.replaced_stale:
            log.info("%s: replacing stale %s (nothing was serving it)", self.resource_name,
                     self.socket_path)
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
        if server is not None and self._stop.is_set():
            # Stopping for good: the socket goes once the kubelet has handled the end of our
            # streams (see plugin.serving.deviceplugin.handover), and before the server's
            # own stop, so the next instance, woken by its removal, may register at once.
            await kubelet_released(self._bound_at, self.timing.release_wait)
            self._remove_ours()
        if server is not None:
            await server.stop(self.timing.stop_grace)
        self._remove_ours()
        self._served = None

    def _remove_ours(self) -> None:
        """Remove the socket at our path if it is still the one this server put there."""
        if self._served is not None and identity(self.socket_path) == self._served:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket_path)
