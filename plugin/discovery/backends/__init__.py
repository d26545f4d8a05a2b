"""Discovery backends: the only code that reads sysfs and /dev.

Besides the :class:`Backend` protocol, every backend here also names the kernel uevent
subsystems that announce its devices in ``uevent_subsystems`` (empty for static backends),
so the caller knows what to feed :func:`plugin.discovery.uevents.kernel_uevents`.
"""

from __future__ import annotations

from plugin.discovery.backends.alveo import AlveoBackend
from plugin.discovery.backends.auto import AutoBackend
from plugin.discovery.backends.aws import AwsBackend
from plugin.discovery.backends.base import Backend, BackendConfig
from plugin.discovery.backends.empty import NoDevicesBackend
from plugin.discovery.backends.intel import IntelBackend
from plugin.discovery.backends.units import UnitsBackend

BACKEND_NAMES = ("auto", "intel", "aws", "alveo", "units", "none")


def make_backend(name: str, config: BackendConfig) -> Backend:
    """Build the backend called ``name``; raise ValueError naming the choices otherwise.

    Construction never touches sysfs, so it cannot fail on a node without accelerators;
    only an unknown name or a bad ``nb_units`` raises.
    """
    if name == "auto":
        return AutoBackend(config)
    if name == "intel":
        return IntelBackend(config)
    if name == "aws":
        return AwsBackend(config)
    if name == "alveo":
        return AlveoBackend(config)
    if name == "units":
        return UnitsBackend(config.nb_units)
    if name == "none":
        return NoDevicesBackend()
    raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKEND_NAMES)}")


SYSFS_BACKENDS = ("auto", "intel", "aws", "alveo")


def missing_roots(name: str, config: BackendConfig) -> list[str]:
    """Why the ``name`` backend will find nothing: its sysfs or /dev root does not exist.

    Not an error: a DaemonSet must keep running (a hostPath can appear later, and the
    plugin then finds the devices by itself); but a typo in ``--sysfs-root`` would
    otherwise look exactly like a node without accelerators.
    """
    if name not in SYSFS_BACKENDS:
        return []
    roots = (("--sysfs-root", config.sysfs_root), ("--dev-root", config.dev_root))
    return [f"{flag} {root} is not a directory; no device can be found under it until it "
            "appears" for flag, root in roots if not root.is_dir()]


def uevent_subsystems(backend: Backend) -> tuple[str, ...]:
    """The uevent subsystems worth a rescan for ``backend`` (none for static backends)."""
    if backend.static:
        return ()
    return tuple(backend.uevent_subsystems)


__all__ = [
    "BACKEND_NAMES",
    "Backend",
    "BackendConfig",
    "make_backend",
    "missing_roots",
    "uevent_subsystems",
]
