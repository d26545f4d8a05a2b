"""``--backend none``: a plugin that registers and serves nothing.

Useful to keep the DaemonSet shape on nodes meant to have no accelerators, and to exercise
the serving side (registration, API negotiation) with no hardware at all.
"""

from __future__ import annotations

from plugin.discovery.backends.base import Deviceless
from value_types.devices import Device


class NoDevicesBackend(Deviceless):
    name = "none"
    static = True

    def scan(self) -> list[Device]:
        return []

