"""Which way a resource registers with the kubelet in front of it, decided per kubelet.

Two channels exist. ``kubelet-socket``: the plugin calls Register on ``kubelet.sock``; every
kubelet since 1.8 has it, and it is the only one before 1.13. ``plugin-watcher``: the plugin
puts its socket in ``plugins_registry`` and the kubelet (1.13+) finds it, registers it and
finds it again after each restart without the plugin doing anything; only ``v1beta1``.

``auto`` decides per kubelet instance (a kubelet is known by its ``kubelet.sock`` file, which
every start creates anew): where the registry directory exists and ``v1beta1`` may be offered,
it offers the watcher first and waits for the kubelet's verdict; a refusal, or no call from
the kubelet in time, sends that kubelet to ``kubelet.sock``. The watcher socket is removed
before the first Register, so one resource is never registered through both channels (the
kubelet would hold two registrations, and the loser going away takes the winner down). The
next kubelet, after a restart or an upgrade, is offered the watcher again.
"""

from __future__ import annotations

import asyncio
import contextlib
from enum import Enum
from pathlib import Path

from api_versions.watcher import GENERATION, RegistrationOutcome
from plugin.serving.routing import FileIdentity

MODES = ("auto", "kubelet-socket", "plugin-watcher")


class Channel(Enum):
    KUBELET_SOCKET = "kubelet-socket"
    PLUGIN_WATCHER = "plugin-watcher"


_NO_VERDICT = object()


class ChannelChooser:
    """Remembers which kubelet turned the watcher down, and picks the channel for a round."""

    def __init__(self, mode: str, registry_dir: Path | None, generations: list[str]) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown registration {mode!r}; choose one of {', '.join(MODES)}")
        self.mode = mode
        self.registry_dir = registry_dir
        self.watcher_possible = GENERATION in generations and registry_dir is not None
        self._declined_by: object = _NO_VERDICT

    @property
    def falls_back(self) -> bool:
        """Whether a silent or refusing watcher sends the resource to ``kubelet.sock``."""
        return self.mode == "auto"

    def choose(self, kubelet: FileIdentity | None) -> Channel:
        if self.mode == "kubelet-socket" or not self.watcher_possible:
            return Channel.KUBELET_SOCKET
        if self.mode == "plugin-watcher":
            return Channel.PLUGIN_WATCHER
        assert self.registry_dir is not None
        if not self.registry_dir.is_dir() or self._declined_by == kubelet:
            return Channel.KUBELET_SOCKET
        return Channel.PLUGIN_WATCHER

    def declined(self, kubelet: FileIdentity | None) -> None:
        """The kubelet known by ``kubelet`` refused the watcher or never called."""
        self._declined_by = kubelet


class WatcherVerdict:
    """What the kubelet's plugin manager has said to one watcher socket."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()
        self._told = asyncio.Event()
        self.outcome: RegistrationOutcome | None = None

    def on_info(self) -> None:
        self.asked.set()

    def on_status(self, outcome: RegistrationOutcome) -> None:
        self.outcome = outcome
        self._told.set()

    def forget(self) -> None:
        """Before a new kubelet is expected: what the previous one said no longer counts."""
        self.asked.clear()
        self._told.clear()
        self.outcome = None

    async def wait(self, timeout: float | None) -> RegistrationOutcome | None:
        """The next outcome; None if the kubelet neither called within ``timeout`` nor
        finished within another ``timeout`` once it had called GetInfo."""
        for _ in range(2):
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._told.wait()
            if self._told.is_set():
                self._told.clear()
                return self.outcome
            if not self.asked.is_set():
                return None
        return None
