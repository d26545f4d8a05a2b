"""``--backend none``: a plugin that registers and serves nothing.

Useful to keep the DaemonSet shape on nodes meant to have no accelerators, and to exercise
the serving side (registration, API negotiation) with no hardware at all.
"""

from __future__ import annotations

from pathlib import Path

from plugin.model import Device


class NoDevicesBackend:
    name = "none"
    static = True
    uevent_subsystems: tuple[str, ...] = ()

    def scan(self) -> list[Device]:
        return []

    def watch_paths(self) -> list[Path]:
        return []
