"""What a discovery backend promises the rest of the plugin.

A backend only answers "what is on this node now" and "where would a change show up". It owns
every sysfs and /dev path; nothing outside ``plugin/backends/`` reads them. Watching, diffing
and serving are done once, for every backend, by ``plugin.monitor`` and ``plugin.server``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from plugin.model import Device


@dataclass(frozen=True)
class BackendConfig:
    """Node-level settings any backend may need; roots are settable so tests use fake trees."""

    sysfs_root: Path = Path("/sys")
    dev_root: Path = Path("/dev")
    nb_units: int = 40


class Backend(Protocol):
    """A source of devices.

    ``scan`` must never raise: a device it cannot understand is skipped, or reported
    Unhealthy, with a warning naming the path. ``watch_paths`` lists directories whose entries
    appearing or disappearing may change the scan (inotify is set on them). ``static`` backends
    never change, so the monitor neither watches nor rescans them.
    """

    name: str
    static: bool

    def scan(self) -> list[Device]: ...

    def watch_paths(self) -> list[Path]: ...


class HealthFiles(Protocol):
    """Optional for a backend: small files whose contents decide health without any event.

    The monitor re-reads them every ``--health-interval`` and rescans when one changed, so a
    crashed AFU or a latched port error reaches the kubelet within that interval rather than
    at the next full rescan. Missing files are fine: reading them simply differs.
    """

    def health_files(self) -> list[Path]: ...
