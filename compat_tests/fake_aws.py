"""AWS FPGA slots in a fake sysfs tree: F1's application and management functions, F2's
application and mailbox functions, and an image's own IDs after a load.

A mixin of :class:`~compat_tests.fake_sysfs.FakeNode`, whose PCI functions it adds and
removes; the attributes and methods below are the node's.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from compat_tests.fake_tree import pci_address, write_file
from plugin.discovery.backends.pci import PciAddress

AMAZON_VENDOR = "0x1d0f"
F1_CLEARED = "0x1042"
F1_MANAGEMENT = "0x1041"
F2_CLEARED = "0x9048"
F2_MANAGEMENT = "0x9248"


class AwsSlots:
    """The node's AWS slots, each (application BDF, management BDF)."""

    slots: list[tuple[str, str]]
    add_function: Callable[..., Path]
    remove_function: Callable[[str], None]
    function_path: Callable[[str], Path]

    # AWS F1 -----------------------------------------------------------------------------

    def add_slot(self, app_bdf: str, *, numa_node: int = 0,
                 app_device: str = F1_CLEARED) -> int:
        """An F1 slot: the application function and its management function at device + 1."""
        app = pci_address(app_bdf)
        management = app.with_device(app.device + 1)
        if management is None:
            raise ValueError(f"{app_bdf}: no room for the management function after it")
        self.add_function(str(app), AMAZON_VENDOR, app_device, numa_node, pci_class="0x058000")
        self.add_function(str(management), AMAZON_VENDOR, F1_MANAGEMENT, numa_node,
                          pci_class="0x058000")
        self.slots.append((str(app), str(management)))
        return len(self.slots) - 1

    def remove_slot(self, app_bdf: str) -> None:
        """Both functions of the slot disappear (instance resized, device unplugged)."""
        for pair in list(self.slots):
            if pair[0] == str(pci_address(app_bdf)):
                self.slots.remove(pair)
                for bdf in pair:
                    self.remove_function(bdf)

    def remove_application_function(self, app_bdf: str) -> None:
        """Only the application function goes, as while an image is being loaded."""
        self.remove_function(app_bdf)

    # AWS F2 -----------------------------------------------------------------------------

    def add_f2_slot(self, app_bdf: str, *, numa_node: int = 0, app_vendor: str = AMAZON_VENDOR,
                    app_device: str = F2_CLEARED, mgmt_function: int = 1, bar: bool = True,
                    subsystem_vendor: str | None = None,
                    subsystem_device: str | None = None) -> int:
        """An F2 slot: the application function at function 0 and its management ("mailbox")
        function ``0x1d0f:0x9248`` at ``mgmt_function`` of the same device, as aws-fpga's
        ``fpga_pci_mbox2app()`` pairs them (its README shows app ``0000:34:00.0`` with
        management ``0000:34:00.1``).

        Both get a ``resource0`` file (BAR0: the application's OCL window, the management
        function's mailbox) unless ``bar`` is False for the application. The PCI class is
        the one :meth:`add_slot` uses for F1 (``0x058000``): F2's own class was not
        established. Subsystem IDs are written only when given: those of a cleared F2 slot
        were not established either, and the fake does not make them up.
        """
        app = pci_address(app_bdf)
        if app.function != 0:
            raise ValueError(f"{app_bdf}: an F2 application function is function 0")
        if not 1 <= mgmt_function <= 7:
            raise ValueError(f"management function {mgmt_function} is not 1..7")
        management = PciAddress(app.domain, app.bus, app.device, mgmt_function)
        self._add_f2_application(str(app), app_vendor, app_device, numa_node, bar,
                                 subsystem_vendor, subsystem_device)
        path = self.add_function(str(management), AMAZON_VENDOR, F2_MANAGEMENT, numa_node,
                                 pci_class="0x058000")
        write_file(path / "resource0", "")
        self.slots.append((str(app), str(management)))
        return len(self.slots) - 1

    def load_afi(self, app_bdf: str, vendor: str, device: str, *,
                 subsystem_vendor: str | None = None,
                 subsystem_device: str | None = None) -> None:
        """The application function re-appears with an image's own IDs, as after an F2 load
        (AWS_Shell_Interface_Specification.md: the image sets the application function's
        vendor, device and subsystem IDs). Works whether the function is there or away;
        NUMA node and BAR0 are kept from the slot as it was."""
        app = str(pci_address(app_bdf))
        management = next(m for a, m in self.slots if a == app)
        numa = (self.function_path(management) / "numa_node").read_text().strip()
        current = self.function_path(app)
        bar = (current / "resource0").exists() or not current.exists()
        self.remove_function(app)
        self._add_f2_application(app, vendor, device, int(numa), bar, subsystem_vendor,
                                 subsystem_device)

    def _add_f2_application(self, app: str, vendor: str, device: str, numa_node: int,
                            bar: bool, subsystem_vendor: str | None,
                            subsystem_device: str | None) -> Path:
        path = self.add_function(app, vendor, device, numa_node, pci_class="0x058000")
        if bar:
            write_file(path / "resource0", "")
        for name, value in (("subsystem_vendor", subsystem_vendor),
                            ("subsystem_device", subsystem_device)):
            if value is not None:
                write_file(path / name, value)
        return path
