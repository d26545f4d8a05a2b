"""PCI addresses spelt the one way the plugin uses for device IDs: ``dddd:bb:dd.f``, lowercase.

The kernel already names functions this way, but users, older plugins and some tools drop
the domain or use upper case; normalising at the edge keeps one function from ever showing
up under two IDs. Every field is hexadecimal: reading ``5e`` as decimal is the mistake that
made the b<>com Intel plugin's IDs unusable.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_BDF = re.compile(
    r"^(?:(?P<domain>[0-9a-fA-F]{1,8}):)?"
    r"(?P<bus>[0-9a-fA-F]{1,2}):(?P<device>[0-9a-fA-F]{1,2})\.(?P<function>[0-7])$"
)
MAX_DEVICE = 0x1F


@dataclass(frozen=True, order=True, slots=True)
class PciAddress:
    """A PCI function address; ordering follows the kernel's own enumeration order."""

    domain: int
    bus: int
    device: int
    function: int

    def __str__(self) -> str:
        return f"{self.domain:04x}:{self.bus:02x}:{self.device:02x}.{self.function:x}"

    def with_device(self, device: int, function: int = 0) -> PciAddress | None:
        """The address of another slot on the same bus, or None if it cannot exist."""
        if not 0 <= device <= MAX_DEVICE:
            return None
        return PciAddress(self.domain, self.bus, device, function)


def parse_bdf(text: str) -> PciAddress | None:
    """Parse ``[domain:]bus:device.function`` (hex, any case); None if it is not one.

    Whitespace around the address is ignored; anything else that is not a valid address
    (device above 0x1f, function above 7, stray characters) gives None, never an exception.
    """
    match = _BDF.match(text.strip())
    if match is None:
        return None
    device = int(match["device"], 16)
    if device > MAX_DEVICE:
        return None
    return PciAddress(
        domain=int(match["domain"] or "0", 16),
        bus=int(match["bus"], 16),
        device=device,
        function=int(match["function"], 16),
    )


def canonical_bdf(text: str) -> str | None:
    """``text`` as a canonical device ID, or None if it is not a PCI address."""
    address = parse_bdf(text)
    return None if address is None else str(address)
