"""AWS "units" mode, compatible with the b<>com plugin: N identical units ``0..N-1``.

Kept for clusters that schedule AWS F1 capacity as abstract units rather than PCI slots; the
IDs, resource name and ``ACCELERATOR_UNITS`` value are exactly what the b<>com plugin gave.
"""

from __future__ import annotations

from plugin.discovery.backends.base import Deviceless
from value_types.devices import Device

MAX_UNITS = 4096


class UnitsBackend(Deviceless):
    name = "units"
    static = True

    def __init__(self, nb_units: int) -> None:
        if not 0 <= nb_units <= MAX_UNITS:
            raise ValueError(f"--accel-nbunits must be between 0 and {MAX_UNITS}, got {nb_units}")
        self.nb_units = nb_units

    def scan(self) -> list[Device]:
        return [
            Device(id=str(i), backend=self.name, attributes=(("kind", "aws-unit"),))
            for i in range(self.nb_units)
        ]

