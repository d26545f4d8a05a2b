"""Registering through the kubelet's plugin watcher: be found, be registered, stay.

A kubelet 1.13+ finds sockets in its ``plugins_registry`` directory, calls ``GetInfo`` and
tells the plugin the outcome; after a restart the new kubelet finds the socket again with no
plugin action. Only ``v1beta1`` can be registered this way. Under ``auto`` a kubelet that
refuses the watcher, or never calls within ``--watcher-wait``, is sent to ``kubelet.sock``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from api_versions.adapter import Adapter
from api_versions.negotiate import KUBELET_SOCKET
from api_versions.watcher import GENERATION as WATCHER_GENERATION
from api_versions.watcher import registration_handlers
from plugin.serving.deviceplugin.channels import ChannelChooser, WatcherVerdict
from plugin.serving.routing import FileIdentity, GenerationRouter, identity

if TYPE_CHECKING:
    from pathlib import Path

    from plugin.serving.deviceplugin.timing import Timing

log = logging.getLogger(__name__)


class WatcherChannel:
    """The plugin-watcher part of
    :class:`~plugin.serving.deviceplugin.server.ResourceServer` (a mixin: see
    :class:`~plugin.serving.deviceplugin.socket.SocketLifecycle` for why)."""

    resource_name: str
    directory: Path
    candidates: list[Adapter]
    timing: Timing
    generation: str | None
    _router: GenerationRouter
    _restart: asyncio.Event
    _stop: asyncio.Event
    _kubelet_changed: asyncio.Event
    _registered_with: FileIdentity | None
    _said_no_registry: bool
    _verdict: WatcherVerdict
    _chooser: ChannelChooser
    socket_path: Path
    _now_registered: Callable[[Adapter], None]
    _hold_terms: Callable[[Adapter, object], Awaitable[None]]
    _pause: Callable[..., Awaitable[None]]

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
            if self._stop.is_set():
                return  # told as the plugin began stopping: nothing to hold
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
