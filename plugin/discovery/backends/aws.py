"""AWS F1 and F2 slots, one device per FPGA, found among the PCI functions of the instance.

Every slot is a pair of PCI functions: a management ("mailbox") function, through which AWS's
tools load images, and the application function the image exposes. Only the management
function has a fixed identity, so slots are found by it alone:

* F1: management ``0x1d0f:0x1041`` (``F1_MBOX_DEVICE_ID``, aws-fpga
  ``sdk/userspace/include/hal/fpga_common.h``); the application function sits at the same
  domain and bus, device - 1, same function number (``F1_MBOX_DEV2APP_DEV``,
  ``GET_DEV_NUM_FROM_FPGA_MBOX_MAP``). Cleared it is ``0x1d0f:0x1042``.
* F2: management ``0x1d0f:0x9248`` (``F2_MBOX_DEVICE_ID``, same header); the application
  function sits at the same domain, bus and device, function 0 (``fpga_pci_mbox2app()`` in
  ``sdk/userspace/fpga_libs/fpga_pci/fpga_pci_sysfs.c``). Cleared it is ``0x1d0f:0x9048``,
  but once an image is loaded it carries the image's own vendor and device IDs
  (``hdk/docs/AWS_Shell_Interface_Specification.md``), so whatever answers at the paired
  address is the application function, whatever its vendor.

Amazon's vendor ID is also on the instance's network and NVMe functions, which is one more
reason to go by management functions only. Slots are numbered as AWS's own tools number them
(``fpga_pci_mbox_scan()`` sorted with ``fpga_pci_slot_spec_compare``): every management
function, F1 and F2 together, in PCI address order, at most ``FPGA_SLOT_MAX`` = 8 of them;
a management function beyond the eighth is ignored with a warning naming it. Numbering by
the management function keeps slot numbers steady while an image load briefly removes the
application function; during that window the slot is listed as Unhealthy rather than
dropped.

Health is what sysfs can show without touching the hardware: the application function is
present, an F2 one also has its BAR0 (``resource0``: without it the slot cannot be used
through its BARs), and the device nodes of a bound driver resolve. Load state and errors
(load failed, power violation, DDR calibration) live only in the mailbox on the management
function's BAR0, which a device plugin must not touch; nothing in sysfs changes without an
event, so there are no health files to re-read.

Device ID: the application function's canonical PCI address. Device nodes: the character
devices a driver bound to the application function registered below it (``xdma/xdma0_user``
on F1, ``drm/renderD128`` under XRT's xocl on F2, whatever the driver), resolved like every
other node (see :mod:`plugin.discovery.backends.devnodes`). With no driver bound there are none, and
the slot is still usable through its PCI BARs, so it stays Healthy.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from plugin.discovery.backends.base import BackendConfig
from plugin.discovery.backends.devnodes import NodeLookup, NodeResolver
from plugin.discovery.backends.pci import PciAddress, parse_bdf
from plugin.discovery.backends.pcifn import PciFunction, pci_id, read_function
from plugin.discovery.backends.sysfs import Notes, exists, is_dir, is_link, list_dir, read_attr
from value_types.devices import Device, DeviceNode, Health

log = logging.getLogger(__name__)

BACKEND = "aws"
DRIVER = "aws-f1"
"""The ``driver`` attribute of F1 slots (kept from before F2 was supported)."""
AMAZON_VENDOR = "0x1d0f"
MANAGEMENT_DEVICE = "0x1041"
"""F1 management function: ``F1_MBOX_DEVICE_ID`` (aws-fpga ``fpga_common.h``)."""
F2_MANAGEMENT_DEVICE = "0x9248"
"""F2 management ("mailbox") function: ``F2_MBOX_DEVICE_ID`` (aws-fpga ``fpga_common.h``,
``IS_F2``). XRT's xocl lists 0x9248 among its user functions too; the AWS SDK, whose
numbering and pairing this backend follows, treats it as the management function."""
PLATFORMS = {MANAGEMENT_DEVICE: "f1", F2_MANAGEMENT_DEVICE: "f2"}
"""Management device ID -> platform, the ``platform`` attribute of the slot."""
DRIVERS = {"f1": DRIVER, "f2": "aws-f2"}
FPGA_SLOT_MAX = 8
"""``FPGA_SLOT_MAX`` in aws-fpga ``fpga_common.h``: the SDK numbers at most this many slots."""
MAX_NODES_PER_SLOT = 64


@dataclass(frozen=True, slots=True)
class Slot:
    number: int
    platform: str
    management: PciFunction
    application: PciFunction | None
    application_address: PciAddress


class AwsBackend:
    """F1 and F2 slots from one walk of ``bus/pci/devices``; see the module docstring."""

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
            log.exception("AWS FPGA discovery under %s failed; reporting no slots",
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
        """None: a slot's health changes only with events (functions and nodes come and go).

        The SDK's own health signals (load failed, power violation, DDR calibration) come
        from the mailbox on management BAR0, not from any file that could be re-read.
        """
        return []

    def _listing(self, warnings: list[str]) -> dict[PciAddress, Path]:
        """Every PCI function in ``bus/pci/devices``, by address; odd names are reported."""
        names = list_dir(self.devices_dir)
        if names is None:
            if is_dir(self.devices_dir):
                warnings.append(f"{self.devices_dir}: cannot be listed; no AWS slots found")
            return {}
        listing: dict[PciAddress, Path] = {}
        for name in names:
            address = parse_bdf(name)
            if address is None:
                warnings.append(f"{self.devices_dir / name}: not a PCI address (dddd:bb:dd.f); "
                                "skipping it")
                continue
            listing[address] = self.devices_dir / name
        return listing

    def _functions(self, listing: dict[PciAddress, Path],
                   warnings: list[str]) -> dict[PciAddress, PciFunction]:
        """The functions with Amazon's vendor ID: the only ones that can be management ones."""
        amazon: dict[PciAddress, PciFunction] = {}
        for address, path in listing.items():
            vendor = read_attr(path / "vendor")
            if vendor.text is None:
                warnings.append(f"{vendor.describe()}; skipping {path.name}")
                continue
            if vendor.text.lower() not in (AMAZON_VENDOR, AMAZON_VENDOR[2:]):
                continue
            amazon[address] = read_function(address, path, warnings)
        return amazon

    def _slots(self, warnings: list[str]) -> list[Slot]:
        """Slots numbered as AWS's tools number them, so ``slot`` matches ``fpga-*`` output.

        A number is taken by every management function among the first eight, even one
        whose slot is then skipped, for the same reason.
        """
        listing = self._listing(warnings)
        functions = self._functions(listing, warnings)
        managers = sorted(a for a, f in functions.items() if f.device in PLATFORMS)
        management_set = set(managers)
        if len(managers) > FPGA_SLOT_MAX:
            extra = ", ".join(str(a) for a in managers[FPGA_SLOT_MAX:])
            warnings.append(
                f"{self.devices_dir}: {len(managers)} AWS FPGA management functions; AWS's "
                f"tools number at most {FPGA_SLOT_MAX} slots (FPGA_SLOT_MAX), so the slots of "
                f"{extra} cannot be loaded through them and are ignored"
            )
        slots: list[Slot] = []
        claimed: dict[PciAddress, int] = {}
        for number, address in enumerate(managers[:FPGA_SLOT_MAX]):
            management = functions[address]
            platform = PLATFORMS[management.device or ""]
            app_address = _application_address(platform, address)
            if app_address is None:
                where = "device 0" if platform == "f1" else "function 0"
                warnings.append(
                    f"{management.path}: {platform.upper()} management function at {where} "
                    f"leaves no address for its application function; skipping slot {number}"
                )
                continue
            if app_address in claimed:
                warnings.append(
                    f"{management.path}: its application function {app_address} is already "
                    f"slot {claimed[app_address]}'s; skipping slot {number}"
                )
                continue
            claimed[app_address] = number
            application = None
            app_path = listing.get(app_address)
            if app_address not in management_set and app_path is not None and is_dir(app_path):
                # Whatever answers at the paired address is the application function: an
                # F2 image sets its own vendor and device IDs.
                application = functions.get(app_address) or read_function(
                    app_address, app_path, warnings)
            slots.append(Slot(number, platform, management, application, app_address))
        return slots

    def _device(self, slot: Slot, resolver: NodeResolver, warnings: list[str]) -> Device:
        attributes = {
            "driver": DRIVERS[slot.platform],
            "platform": slot.platform,
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
            attributes.update(_subsystem_ids(slot.application.path, warnings))
            bar0 = slot.application.path / "resource0"
            # F1 slots are not held to BAR0 yet: their behaviour is kept as it was.
            if slot.platform == "f2" and not exists(bar0):
                reasons.append(f"{bar0} missing: slot {slot.number} cannot be used through "
                               "its BAR0")
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


AwsF1Backend = AwsBackend
"""The name this backend had when it only knew F1; kept so existing imports still work."""


def _application_address(platform: str, management: PciAddress) -> PciAddress | None:
    """Where the SDK looks for a slot's application function (``fpga_pci_mbox2app()``).

    F1: device - 1, same function (``F1_MBOX_DEV2APP_DEV``). F2: same device, function 0
    (``GET_DEV_NUM_FROM_FPGA_MBOX_MAP``/``GET_FUNC_NUM_FROM_FPGA_MBOX_MAP``); a management
    function that is itself function 0 has no such address. None when there is none.
    """
    if platform == "f1":
        return management.with_device(management.device - 1, management.function)
    if management.function == 0:
        return None
    return management.with_device(management.device, 0)


def _subsystem_ids(function: Path, warnings: list[str]) -> dict[str, str]:
    """``subsystem_vendor``/``subsystem_device`` of the function, where readable.

    The SDK checks them against what a loaded image declares, so they help tell images
    apart. A missing file is left out silently (kernels always have them, older fake trees
    do not); an unreadable or garbage one is reported and left out.
    """
    ids = {}
    for name in ("subsystem_vendor", "subsystem_device"):
        attr = read_attr(function / name)
        if attr.missing:
            continue
        value = pci_id(attr, warnings)
        if value is not None:
            ids[name] = value
    return ids
