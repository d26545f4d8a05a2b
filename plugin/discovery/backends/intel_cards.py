"""Which Intel FPGA card a PCI function is, from the IDs the kernel's DFL driver binds to.

The table is ``cci_pcie_id_tbl`` of ``drivers/fpga/dfl-pci.c`` (Linux mainline, 2025/26),
with each entry named after its ``PCIE_DEVICE_ID_*`` / ``PCIE_SUBDEVICE_ID_*`` macro. OFS
cards (Agilex N6000/N6001, C6100, and the D5005 on the OFS stack) share the device IDs
``0xbcce`` (physical function) and ``0xbccf`` (virtual function) and differ only in their
subsystem device ID, which is why those two are matched with it.

Discovery does not depend on this table: ports are found through the driver's class
directories whatever the IDs, so a card newer than this table is still served. The name is
for people (``discover``, the ``card`` attribute), and says which entries are virtual
functions.
"""

from __future__ import annotations

from dataclasses import dataclass

INTEL = "0x8086"
SILICOM_DENMARK = "0x1c2c"
"""``PCI_VENDOR_ID_SILICOM_DENMARK`` (include/linux/pci_ids.h)."""
OFS_PF = "0xbcce"
"""``PCIE_DEVICE_ID_INTEL_DFL``."""
OFS_VF = "0xbccf"
"""``PCIE_DEVICE_ID_INTEL_DFL_VF``."""


@dataclass(frozen=True)
class CardModel:
    name: str
    virtual_function: bool = False


BY_DEVICE: dict[tuple[str, str], CardModel] = {
    (INTEL, "0xbcbd"): CardModel("INT_5_X"),
    (INTEL, "0xbcbf"): CardModel("INT_5_X", virtual_function=True),
    (INTEL, "0xbcc0"): CardModel("INT_6_X"),
    (INTEL, "0xbcc1"): CardModel("INT_6_X", virtual_function=True),
    (INTEL, "0x09c4"): CardModel("DSC_1_X"),
    (INTEL, "0x09c5"): CardModel("DSC_1_X", virtual_function=True),
    (INTEL, "0x0b30"): CardModel("PAC N3000"),
    (INTEL, "0x0b2b"): CardModel("PAC D5005"),
    (INTEL, "0x0b2c"): CardModel("PAC D5005", virtual_function=True),
    (SILICOM_DENMARK, "0x1000"): CardModel("Silicom PAC N5010"),
    (SILICOM_DENMARK, "0x1001"): CardModel("Silicom PAC N5011"),
}
"""Entries matched on vendor and device alone (``PCI_DEVICE``)."""

OFS_SUBDEVICES: dict[str, str] = {
    "0x138d": "D5005",  # PCIE_SUBDEVICE_ID_INTEL_D5005 (physical function only)
    "0x1770": "N6000",  # PCIE_SUBDEVICE_ID_INTEL_N6000
    "0x1771": "N6001",  # PCIE_SUBDEVICE_ID_INTEL_N6001
    "0x17d4": "C6100",  # PCIE_SUBDEVICE_ID_INTEL_C6100
}
"""Subsystem device IDs of the ``0xbcce``/``0xbccf`` entries (``PCI_DEVICE_SUB``)."""


def needs_subsystem(vendor: str | None, device: str | None) -> bool:
    """Whether the card can only be named with its subsystem device ID."""
    return vendor == INTEL and device in (OFS_PF, OFS_VF)


def card_model(vendor: str | None, device: str | None,
               subsystem_device: str | None = None) -> CardModel | None:
    """The card a function belongs to, or None for IDs the DFL driver's table lacks."""
    if vendor is None or device is None:
        return None
    if needs_subsystem(vendor, device):
        name = OFS_SUBDEVICES.get(subsystem_device or "")
        return None if name is None else CardModel(f"OFS {name}", device == OFS_VF)
    return BY_DEVICE.get((vendor, device))
