"""Registering through ``kubelet.sock``: negotiate a generation, round after round.

Every kubelet since 1.8 has ``kubelet.sock``. A round offers each generation newest first
(:func:`api_versions.negotiate.negotiate`), switching the socket to that generation before
offering it, because recent kubelets dial back during Register. A round that ends
unregistered (kubelet absent, refusing every generation, hanging) is retried with a growing
pause; a new ``kubelet.sock`` cuts short whatever the round is doing (a pause, a retry
back-off, a call to a dead kubelet) and starts a fresh round at once, so a kubelet is met
within milliseconds of appearing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from api_versions.adapter import Adapter
from api_versions.negotiate import (
    KUBELET_SOCKET,
    NegotiationError,
    NoGenerationAccepted,
    Withdrawn,
    negotiate,
)
from api_versions.retry import RetryPolicy
from plugin.process import metrics
from plugin.serving.deviceplugin.channels import Channel, ChannelChooser
from plugin.serving.routing import FileIdentity, GenerationRouter, identity

if TYPE_CHECKING:
    from pathlib import Path

    from plugin.serving.deviceplugin.timing import Timing

log = logging.getLogger(__name__)


class KubeletSocketChannel:
    """The ``kubelet.sock`` part of
    :class:`~plugin.serving.deviceplugin.server.ResourceServer` (a mixin: see
    :class:`~plugin.serving.deviceplugin.socket.SocketLifecycle` for why)."""

    resource_name: str
    socket_name: str
    directory: Path
    candidates: list[Adapter]
    policy: RetryPolicy
    timing: Timing
    channel: Channel
    _router: GenerationRouter
    _restart: asyncio.Event
    _stop: asyncio.Event
    _kubelet_appeared: asyncio.Event
    _round_target: FileIdentity | None
    _registered_with: FileIdentity | None
    _chooser: ChannelChooser
    _now_registered: Callable[[Adapter], None]
    _hold_terms: Callable[[Adapter, object], Awaitable[None]]
    _pause: Callable[..., Awaitable[None]]

    async def _register_and_hold(self) -> None:
        pause = self.timing.round_backoff_initial
        while True:
            adapter = await self._round()
            if isinstance(adapter, Withdrawn):
                log.info("%s: %s", self.resource_name, adapter)
                return
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

    async def _round(self) -> Adapter | NegotiationError | None:
        """One negotiation round: the adapter, why it failed, or None if a kubelet came.

        The round is abandoned the moment a different ``kubelet.sock`` appears: whatever it
        was doing (a back-off between retries, a Register to a kubelet that has just died)
        can only delay meeting the new kubelet.
        """
        self._round_target = identity(self.directory / KUBELET_SOCKET)
        self._kubelet_appeared.clear()
        if self._chooser.choose(self._round_target) is not self.channel:
            # The kubelet came between the channel's choice and this round (a kubelet
            # start removes this socket, then creates kubelet.sock: the channel may have
            # been chosen in between, with no kubelet there): its directory event was
            # spent on the restart, so it must be met here, through its own channel.
            log.info("%s: a kubelet.sock appeared as the channel was chosen; choosing "
                     "again for it", self.resource_name)
            return None
        attempt = asyncio.create_task(negotiate(
            self.directory, self.candidates, self, self.socket_name,
            self.policy, before_attempt=self._offer, wanted=lambda: not self._stop.is_set(),
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
