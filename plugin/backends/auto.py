"""``--backend auto``: serve whatever accelerators the node has, or none without failing.

One DaemonSet usually runs on every node of a mixed cluster, so the backend cannot be chosen
per node by hand. Each scan asks the Intel backend first and falls back to AWS F1 slots;
the choice is remade on every scan, so a card whose driver loads late is still found. A
node without any FPGA serves zero devices and says so once (again only after devices have
come and gone), instead of exiting and crash-looping the DaemonSet.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from plugin.backends.aws import AwsF1Backend
from plugin.backends.base import BackendConfig
from plugin.backends.intel import IntelBackend
from plugin.model import Device

log = logging.getLogger(__name__)


class AutoBackend:
    name = "auto"
    static = False

    def __init__(self, config: BackendConfig) -> None:
        self.intel = IntelBackend(config)
        self.aws = AwsF1Backend(config)
        self.uevent_subsystems = tuple(
            dict.fromkeys(self.intel.uevent_subsystems + self.aws.uevent_subsystems)
        )
        self._lock = threading.Lock()
        self._said_empty = False

    def scan(self) -> list[Device]:
        devices = self.intel.scan() or self.aws.scan()
        with self._lock:
            if devices:
                self._said_empty = False
            elif not self._said_empty:
                self._said_empty = True
                places = ", ".join(str(p) for p in self.intel.places() + self.aws.places())
                log.info("no Intel FPGA port and no AWS F1 slot found (looked in %s); "
                         "serving zero devices until one appears", places)
        return devices

    def watch_paths(self) -> list[Path]:
        return list(dict.fromkeys(self.intel.watch_paths() + self.aws.watch_paths()))
