"""What a discovery backend promises the rest of the plugin.

A backend only answers "what is on this node now" and "where would a change show up". It owns
every sysfs and /dev path; nothing outside ``plugin/discovery/backends/`` reads them. Watching,
diffing and serving are done once, for every backend, by ``plugin.discovery.monitor`` and
``plugin.serving.deviceplugin.server``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from value_types.devices import Device


@dataclass(frozen=True)
class BackendConfig:
    """Node-level settings any backend may need; roots are settable so tests use fake trees."""

    sysfs_root: Path = Path("/sys")
    dev_root: Path = Path("/dev")
    nb_units: int = 40


class Backend(Protocol):
    """A source of devices, and everything the monitor needs to follow it.

    ``scan`` must never raise: a device it cannot understand is skipped, or reported
    Unhealthy, with a warning naming the path. Every ability below is required, with an
    empty answer where a backend has nothing to offer, so no caller ever has to ask whether
    a backend "has" one, and a composite (``--backend auto``) cannot silently drop one of
    its parts' abilities (``tests/backends/test_composite.py`` holds every composite to
    :data:`ABILITIES`).

    * ``static`` backends never change, so the monitor neither watches nor rescans them.
    * ``watch_paths``: directories whose entries appearing or disappearing may change the
      scan (inotify is set on them).
    * ``health_files``: small files whose contents decide health without any event (a
      crashed AFU, a latched port error), as found by the last scan. The monitor re-reads
      them every ``--health-interval`` and rescans when one changed, so such a failure
      reaches the kubelet within that interval rather than at the next full rescan.
    * ``uevent_subsystems``: kernel uevent subsystems that announce this backend's devices.
    * ``places``: where devices are looked for, for messages that say what was searched.
    """

    name: str
    static: bool
    uevent_subsystems: tuple[str, ...]

    def scan(self) -> list[Device]: ...

    def watch_paths(self) -> list[Path]: ...

    def health_files(self) -> list[Path]: ...

    def places(self) -> list[Path]: ...


ABILITIES = ("uevent_subsystems", "watch_paths", "health_files", "places")
"""Every member of :class:`Backend` beyond ``name``, ``static`` and ``scan``: what a
composite must combine from its parts."""


class Deviceless:
    """The empty answer to every ability, for backends that read nothing from the node."""

    uevent_subsystems: tuple[str, ...] = ()

    def watch_paths(self) -> list[Path]:
        return []

    def health_files(self) -> list[Path]:
        return []

    def places(self) -> list[Path]:
        return []
