"""AWS F1 slots, one device per FPGA, found among the PCI functions of the instance.

Each slot is an application function (vendor ``0x1d0f``; device ``0x1042`` when cleared,
``0xf000``/``0xf010`` or the image's own IDs once an image is loaded) followed, at the next
device number, by its management function ``0x1d0f:0x1041``. Amazon's vendor ID is also on
the instance's network and NVMe functions, so only an application function paired with a
management function is a slot. Slots are numbered in the order the management functions
appear in ``bus/pci/devices``, as AWS's own tools number them; numbering by the management
function keeps slot numbers steady while an image load briefly removes the application
function. During that window the slot is listed as Unhealthy rather than dropped.

Device ID: the application function's canonical PCI address. Device nodes: the character
devices a driver bound to the application function registered below it (for example
``xdma/xdma0_user``), resolved like every other node (see :mod:`plugin.backends.devnodes`);
with no driver bound there are none, and the slot is still usable through its PCI BARs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from plugin.backends.base import BackendConfig
from plugin.backends.devnodes import NodeLookup, NodeResolver
from plugin.backends.pci import PciAddress, parse_bdf
from plugin.backends.pcifn import PciFunction, read_function
from plugin.backends.sysfs import Notes, is_dir, is_link, list_dir, read_attr
from plugin.model import Device, DeviceNode, Health

log = logging.getLogger(__name__)

BACKEND = "aws"
DRIVER = "aws-f1"
AMAZON_VENDOR = "0x1d0f"
MANAGEMENT_DEVICE = "0x1041"
MAX_NODES_PER_SLOT = 64


@dataclass(frozen=True, slots=True)
class Slot:
    number: int
    management: PciFunction
    application: PciFunction | None
    application_address: PciAddress


class AwsF1Backend:
    name = BACKEND
    static = False
    uevent_subsystems = ("pci",)

    def __init__(self, config: BackendConfig) -> None:
        self.sysfs_root = config.sysfs_root
        self.dev_root = config.dev_root
        self._notes = Notes(log)

    @property
    def devices_dir(self) -> Path:
        return self.sysfs_root / "bus" / "pci" / "devices"

    def scan(self) -> list[Device]:
        warnings = self._notes.start()
        try:
            resolver = NodeResolver(self.dev_root)
            devices = []
            for slot in self._slots(warnings):
                try:
                    devices.append(self._device(slot, resolver, warnings))
                except ValueError as exc:  # the model refused a value: lose this slot only
                    warnings.append(f"{slot.management.path}: {exc}; skipping slot {slot.number}")
        except Exception:
            log.exception("AWS F1 discovery under %s failed; reporting no slots",
                          self.devices_dir)
            devices = []
        self._notes.flush(warnings)
        return devices

    def watch_paths(self) -> list[Path]:
        """The PCI device list (slots come and go there) and the device-node directory."""
        return [p for p in (self.devices_dir, self.dev_root) if is_dir(p)]

    def places(self) -> list[Path]:
        return [self.devices_dir]

    def health_files(self) -> list[Path]:
        """None: a slot's health changes only with events (functions and nodes come and go)."""
        return []

    def _functions(self, warnings: list[str]) -> dict[PciAddress, PciFunction]:
        names = list_dir(self.devices_dir)
        if names is None:
            if is_dir(self.devices_dir):
                warnings.append(f"{self.devices_dir}: cannot be listed; no F1 slots found")
            return {}
        amazon: dict[PciAddress, PciFunction] = {}
        for name in names:
            path = self.devices_dir / name
            address = parse_bdf(name)
            if address is None:
                warnings.append(f"{path}: not a PCI address (dddd:bb:dd.f); skipping it")
                continue
            vendor = read_attr(path / "vendor")
            if vendor.text is None:
                warnings.append(f"{vendor.describe()}; skipping {name}")
                continue
            if vendor.text.lower() not in (AMAZON_VENDOR, AMAZON_VENDOR[2:]):
                continue
            amazon[address] = read_function(address, path, warnings)
        return amazon

    def _slots(self, warnings: list[str]) -> list[Slot]:
        functions = self._functions(warnings)
        managers = sorted(a for a, f in functions.items() if f.device == MANAGEMENT_DEVICE)
        slots = []
        for number, address in enumerate(managers):
            app_address = address.with_device(address.device - 1, 0)
            if app_address is None:
                warnings.append(
                    f"{functions[address].path}: F1 management function at device 0 has no "
                    f"application function before it; skipping slot {number}"
                )
                continue
            application = functions.get(app_address)
            if application is not None and application.device == MANAGEMENT_DEVICE:
                application = None
            slots.append(Slot(number, functions[address], application, app_address))
        return slots

    def _device(self, slot: Slot, resolver: NodeResolver, warnings: list[str]) -> Device:
        attributes = {
            "driver": DRIVER,
            "slot": str(slot.number),
            "management_address": slot.management.bdf,
            "pci_address": str(slot.application_address),
        }
        reasons = []
        nodes: tuple[DeviceNode, ...] = ()
        numa = slot.management.numa_node
        if slot.application is None:
            reasons.append(
                f"application function {slot.application_address} of slot {slot.number} is "
                f"absent from {self.devices_dir} (image being loaded or cleared?)"
            )
        else:
            numa = slot.application.numa_node
            if slot.application.vendor:
                attributes["vendor"] = slot.application.vendor
            if slot.application.device:
                attributes["device"] = slot.application.device
            lookups = self._driver_nodes(slot.application.path, resolver, warnings)
            nodes = tuple(n.node for n in lookups if n.node is not None)
            reasons += [n.problem for n in lookups if n.node is None]
        return Device(
            id=str(slot.application_address),
            backend=BACKEND,
            health=Health.UNHEALTHY if reasons else Health.HEALTHY,
            health_reason="; ".join(reasons),
            numa_node=numa,
            nodes=nodes,
            attributes=tuple(attributes.items()),
        )

    def _driver_nodes(self, function: Path, resolver: NodeResolver,
                      warnings: list[str]) -> list[NodeLookup]:
        """Character devices registered below the function: ``<fn>/<class>/<name>/dev``.

        Only real subdirectories are searched; the function's links (``driver``,
        ``physfn``, ``subsystem``...) lead elsewhere in sysfs and are not its devices.
        """
        lookups = []
        for group in list_dir(function) or []:
            group_dir = function / group
            if is_link(group_dir) or not is_dir(group_dir):
                continue
            for name in list_dir(group_dir) or []:
                child = group_dir / name
                if is_link(child) or not is_dir(child):
                    continue
                dev = read_attr(child / "dev")
                if dev.missing:
                    continue
                lookup = resolver.resolve(dev, name)
                if lookup.warning:
                    warnings.append(lookup.warning)
                lookups.append(lookup)
                if len(lookups) >= MAX_NODES_PER_SLOT:
                    warnings.append(f"{function}: more than {MAX_NODES_PER_SLOT} device nodes; "
                                    "ignoring the rest")
                    return lookups
        return lookups
