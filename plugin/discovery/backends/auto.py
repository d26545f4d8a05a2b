"""``--backend auto``: serve whatever accelerators the node has, or none without failing.

One DaemonSet usually runs on every node of a mixed cluster, so the backend cannot be chosen
per node by hand. Every scan asks each family's backend and serves what all of them found,
so a card whose driver loads late is still found, and a node with more than one family is
served whole. A node without any FPGA serves zero devices and says so once (again only
after devices have come and gone), instead of exiting and crash-looping the DaemonSet.

A composite offers every ability of its parts (see ``plugin.discovery.backends.base.ABILITIES``):
``--backend auto`` must react as fast as the backend it stands for.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TypeVar

from plugin.discovery.backends.alveo import AlveoBackend
from plugin.discovery.backends.aws import AwsBackend
from plugin.discovery.backends.base import Backend, BackendConfig
from plugin.discovery.backends.intel import IntelBackend
from value_types.devices import Device

log = logging.getLogger(__name__)

T = TypeVar("T")


class CompositeBackend:
    """Several backends served as one; each ability is the ordered union of the parts'."""

    def __init__(self, name: str, parts: Sequence[Backend], nothing_found: str) -> None:
        self.name = name
        self.parts = tuple(parts)
        self.static = all(part.static for part in self.parts)
        self.uevent_subsystems = _union(p.uevent_subsystems for p in self.parts)
        self._nothing_found = nothing_found
        self._lock = threading.Lock()
        self._said_empty = False

    def scan(self) -> list[Device]:
        devices = [device for part in self.parts for device in part.scan()]
        with self._lock:
            if devices:
                self._said_empty = False
            elif not self._said_empty:
                self._said_empty = True
                places = ", ".join(str(p) for p in self.places())
                log.info("%s (looked in %s)", self._nothing_found, places)
        return devices

    def watch_paths(self) -> list[Path]:
        return list(_union(p.watch_paths() for p in self.parts))

    def health_files(self) -> list[Path]:
        return list(_union(p.health_files() for p in self.parts))

    def places(self) -> list[Path]:
        return list(_union(p.places() for p in self.parts))


def _union(groups: Iterable[Iterable[T]]) -> tuple[T, ...]:
    return tuple(dict.fromkeys(item for group in groups for item in group))


class AutoBackend(CompositeBackend):
    def __init__(self, config: BackendConfig) -> None:
        self.intel = IntelBackend(config)
        self.aws = AwsBackend(config)
        self.alveo = AlveoBackend(config)
        super().__init__("auto", [self.intel, self.aws, self.alveo],
                         "no Intel FPGA port, AWS FPGA slot or Alveo card found")
