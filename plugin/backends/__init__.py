"""Discovery backends: the only code that reads sysfs and /dev."""

from __future__ import annotations

from plugin.backends.base import Backend, BackendConfig
from plugin.backends.units import UnitsBackend

BACKEND_NAMES = ("units",)


def make_backend(name: str, config: BackendConfig) -> Backend:
    """Build the backend called ``name``; raise ValueError naming the choices otherwise."""
    if name == "units":
        return UnitsBackend(config.nb_units)
    raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKEND_NAMES)}")


__all__ = ["BACKEND_NAMES", "Backend", "BackendConfig", "make_backend"]
