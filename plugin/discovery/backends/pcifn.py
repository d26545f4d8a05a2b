"""What sysfs says about one PCI function: its address, IDs and NUMA node.

Both the Intel and the AWS backends identify devices by PCI function, so reading a
function's attributes and finding the function a driver's device hangs off are done once,
here, with the same tolerance: a missing NUMA node is "no NUMA", a garbage one is reported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from plugin.discovery.backends.pci import PciAddress, parse_bdf
from plugin.discovery.backends.sysfs import Attr, exists, link_target_name, read_attr, real_path
from value_types.devices import MAX_NUMA_NODES

MAX_ANCESTORS = 8
"""How far up a class device may sit below its PCI function (OPAE and DFL need 2 to 3)."""

_ID = re.compile(r"^(?:0x)?([0-9a-fA-F]{1,4})$")
_NUMA = re.compile(r"^[-+]?[0-9]+$")
"""Plain decimal only: ``int()`` alone would also take ``1_0`` and other spellings."""


@dataclass(frozen=True, slots=True)
class PciFunction:
    address: PciAddress
    path: Path
    vendor: str | None = None
    device: str | None = None
    numa_node: int | None = None
    physfn: PciAddress | None = None

    @property
    def bdf(self) -> str:
        return str(self.address)


def read_function(address: PciAddress, path: Path, warnings: list[str]) -> PciFunction:
    """Read vendor, device, NUMA node and SR-IOV parent; problems go to ``warnings``."""
    physfn_name = link_target_name(path / "physfn")
    return PciFunction(
        address=address,
        path=path,
        vendor=pci_id(read_attr(path / "vendor"), warnings),
        device=pci_id(read_attr(path / "device"), warnings),
        numa_node=numa_node(read_attr(path / "numa_node"), warnings),
        physfn=parse_bdf(physfn_name) if physfn_name else None,
    )


def pci_id(attr: Attr, warnings: list[str]) -> str | None:
    """A vendor or device ID as ``0xhhhh`` (lowercase); None, with a warning, if unreadable."""
    if attr.text is None:
        warnings.append(attr.describe())
        return None
    match = _ID.match(attr.text)
    if match is None:
        warnings.append(f"{attr.path}: {attr.text[:40]!r} is not a PCI ID")
        return None
    return f"0x{int(match[1], 16):04x}"


def numa_node(attr: Attr, warnings: list[str]) -> int | None:
    """The NUMA node, None for ``-1`` or a kernel without NUMA; garbage is reported and ignored.

    Only ``-1`` and ``0..MAX_NUMA_NODES-1`` are NUMA nodes. A larger value is not a node this
    kernel can have, and one that does not even fit the wire's int64 would fail the kubelet's
    whole device stream, so it is "unknown", with one warning naming the file.
    """
    if attr.missing:
        return None
    if attr.text is None:
        warnings.append(f"{attr.describe()}; NUMA node unknown")
        return None
    if _NUMA.match(attr.text) is None:
        warnings.append(f"{attr.path}: {attr.text[:40]!r} is not a NUMA node; NUMA node unknown")
        return None
    # Digits beyond 8 cannot be a node; not converting them also keeps clear of int()'s
    # limit on very long numbers.
    value = int(attr.text, 10) if len(attr.text) <= 8 else None
    if value == -1:
        return None
    if value is None or not 0 <= value < MAX_NUMA_NODES:
        warnings.append(f"{attr.path}: {attr.text[:40]!r} is neither -1 nor a NUMA node "
                        f"0..{MAX_NUMA_NODES - 1}; NUMA node unknown")
        return None
    return value


def owning_function(entry: Path) -> tuple[PciAddress, Path] | None:
    """The PCI function a class device (``class/fpga/intel-fpga-dev.0``, ``regionN``) belongs to.

    The ``device`` link is the kernel's own answer (and the function is then read through
    it, which costs no path resolution); when it is absent or dangles, the nearest ancestor
    of the resolved path that is named like a PCI address is used.
    """
    link = entry / "device"
    name = link_target_name(link)
    if name is not None:
        address = parse_bdf(name)
        if address is not None and exists(link):
            return address, link
    resolved = real_path(entry)
    if resolved is None:
        return None
    for ancestor in list(resolved.parents)[:MAX_ANCESTORS]:
        address = parse_bdf(ancestor.name)
        if address is not None:
            return address, ancestor
    return None
