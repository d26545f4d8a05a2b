"""Which event sources, beyond inotify on the backend's directories, wake a rescan."""

from __future__ import annotations

from plugin.discovery.backends import uevent_subsystems
from plugin.discovery.backends.base import Backend
from plugin.discovery.monitor import TriggerSource


def triggers_for(backend: Backend) -> list[TriggerSource]:
    """Kernel uevents of the subsystems the backend reads, where the backend declares any."""
    subsystems = uevent_subsystems(backend)
    if not subsystems:
        return []
    from plugin.discovery.uevents import kernel_uevents

    return [lambda: kernel_uevents(subsystems)]
