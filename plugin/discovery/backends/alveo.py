"""AMD/Xilinx Alveo cards under XRT: one device per user physical function.

Facts, from the XRT driver sources (``src/runtime_src/core/pcie/driver/linux/xocl``) and
Xilinx's own device plugin (``FPGA_as_a_Service/k8s-device-plugin/fpga.go``):

* An Alveo card shows two PCI functions on one domain:bus:device: a management function
  driven by ``xclmgmt`` and a user function driven by ``xocl``. Vendors: ``0x10ee`` (Xilinx)
  and ``0x13fe`` (Advantech), the vendors of ``XOCL_USER_XDMA_PCI_IDS`` and
  ``XOCL_MGMT_PCI_IDS`` (``devices.h``), and ``0x3475`` (Arista), which Xilinx's plugin also
  accepts (``AristaVendorID``). xocl also drives Amazon's ``0x1d0f`` F1/F2 functions; those
  are slots of the ``aws`` backend, so they are not listed twice.
* Which function is which is told by the marker files the drivers create, ``user_pf``
  (``userpf/xocl_sysfs.c``) and ``mgmt_pf`` (``mgmtpf/mgmt-sysfs.c``), as XRT and Xilinx's
  plugin both do: function numbers were swapped in the 2018.3 shells, and device IDs follow
  no stated rule. A function beside a management function that carries neither marker is a
  user function without its driver, listed Unhealthy. With neither driver bound nothing
  tells the functions apart, and nothing is advertised.
* The user function's DRM render node, ``<function>/drm/renderD<N>`` in sysfs and
  ``/dev/dri/renderD<N>`` on the node, is how the runtime reaches the card (XRT's
  ``pcidrv_xocl.h`` and ``pcidev.cpp`` locate it the same way), so it is the DeviceSpec. The
  management node ``/dev/xclmgmt<N>`` flashes shells and resets cards; a workload does not
  need it and is not given it.
* The shell is the ROM subdevice's ``VBNV`` and ``timestamp`` (``subdev/feature_rom.c``,
  ``rom_attrs``). Subdevice directories are ``<name>.u.<instance>`` with instance numbers
  shared by all cards, so they are matched by prefix, as XRT's ``get_subdev_dir_name`` does.

* What the card holds, from the user function's own attributes (``userpf/xocl_sysfs.c``):
  ``logic_uuids``, the shell partition's logic UUID from the shell's device tree
  (``PROP_LOGIC_UUID``, printed as the tree stores it, 32 hex digits); ``interface_uuids``,
  one per line, the interfaces an xclbin may be built against (``PROP_INTERFACE_UUID``; only
  recorded when there is exactly one, so a selector never sees half of a list); and
  ``xclbinuuid``, the UUID of the xclbin loaded now (``%pUb``: 36 characters with dashes,
  all zeros when none is, empty when the driver cannot tell). Both files are empty while the
  card has no device tree; an unparsable value is reported and left out, never guessed.

Health, recomputed on every scan. A card is Unhealthy when:

* its user function has no xocl driver;
* it has no render node, or the node is missing;
* ``ready`` reads 0 (``xocl_sysfs.c``: the management side has not brought the card up;
  XRT lists such cards as not ready);
* ``dev_offline`` is non-zero (offline, or a negative errno when the driver cannot tell);
* ``device_bad_state`` is non-zero;
* a firewall's ``status`` is non-zero (``subdev/firewall.c``: an AXI firewall tripped;
  xclmgmt's health thread treats that as a card in a bad state).

These files change without any event, so they are health files, re-read every
``--health-interval``. A file that is absent (older drivers) gives no opinion; one that
cannot be read or parsed makes the card Unhealthy, since the plugin cannot vouch for it.
``mig_calibration`` is not used: XRT's own enumeration ignores it, and a zero there does not
mean the same on every shell.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from plugin.discovery.backends.base import BackendConfig
from plugin.discovery.backends.devnodes import NodeResolver
from plugin.discovery.backends.hexid import DASHED_UUID, uuid_hex
from plugin.discovery.backends.pci import PciAddress, parse_bdf
from plugin.discovery.backends.pcifn import PciFunction, pci_id, read_function
from plugin.discovery.backends.sysfs import (
    Attr,
    Notes,
    exists,
    is_dir,
    is_link,
    list_dir,
    read_attr,
)
from value_types.devices import Device, Health

log = logging.getLogger(__name__)

BACKEND = "alveo"
DRIVER = "xocl"
VENDORS = {"0x10ee": "Xilinx", "0x13fe": "Advantech", "0x3475": "Arista"}
USER_MARKER = "user_pf"
MANAGEMENT_MARKER = "mgmt_pf"
ROM_PREFIX = "rom."
FIREWALL_PREFIX = "firewall."
RENDER_PREFIX = "renderD"
RENDER_DIRECTORY = "dri"
"""Where udev puts DRM nodes below /dev."""
STATE_FILES = ("ready", "dev_offline", "device_bad_state")
MAX_RENDER_NODES = 4
MAX_FIREWALLS = 16
NO_XCLBIN = "00000000-0000-0000-0000-000000000000"


@dataclass(frozen=True, slots=True)
class Card:
    user: PciFunction
    management: PciFunction | None
    bound: bool
    """Whether xocl drives the user function (its ``user_pf`` marker exists)."""


@dataclass(frozen=True, slots=True)
class _Function:
    function: PciFunction
    user: bool
    management: bool


class AlveoBackend:
    name = BACKEND
    static = False
    uevent_subsystems = ("pci", "drm", "platform")

    def __init__(self, config: BackendConfig) -> None:
        self.sysfs_root = config.sysfs_root
        self.dev_root = config.dev_root
        self._notes = Notes(log)
        self._health_files: tuple[Path, ...] = ()

    @property
    def devices_dir(self) -> Path:
        return self.sysfs_root / "bus" / "pci" / "devices"

    def scan(self) -> list[Device]:
        warnings = self._notes.start()
        health_files: list[Path] = []
        try:
            resolver = NodeResolver(self.dev_root)
            devices = []
            for card in self._cards(warnings):
                try:
                    devices.append(self._device(card, resolver, warnings, health_files))
                except ValueError as exc:  # the model refused a value: lose this card only
                    warnings.append(f"{card.user.path}: {exc}; skipping it")
            self._health_files = tuple(health_files)
        except Exception:
            log.exception("Alveo discovery under %s failed; reporting no cards", self.devices_dir)
            devices = []
        self._notes.flush(warnings)
        return devices

    def watch_paths(self) -> list[Path]:
        """The PCI device list and the device-node directories render nodes appear in."""
        candidates = (self.devices_dir, self.dev_root, self.dev_root / RENDER_DIRECTORY)
        return [p for p in candidates if is_dir(p)]

    def places(self) -> list[Path]:
        return [self.devices_dir]

    def health_files(self) -> list[Path]:
        """Each served card's ``ready``, ``dev_offline``, ``device_bad_state`` and firewall
        ``status`` files, as found by the last scan: they change without any event."""
        return list(self._health_files)

    def _functions(self, warnings: list[str]) -> dict[PciAddress, _Function]:
        names = list_dir(self.devices_dir)
        if names is None:
            if is_dir(self.devices_dir):
                warnings.append(f"{self.devices_dir}: cannot be listed; no Alveo cards found")
            return {}
        found: dict[PciAddress, _Function] = {}
        for name in names:
            path = self.devices_dir / name
            address = parse_bdf(name)
            if address is None:
                continue  # the aws backend, which lists the same directory, says so
            vendor = read_attr(path / "vendor")
            # The aws backend lists the same directory and reports unreadable vendors.
            if pci_id(vendor, []) not in VENDORS:
                continue
            found[address] = _Function(read_function(address, path, warnings),
                                       user=exists(path / USER_MARKER),
                                       management=exists(path / MANAGEMENT_MARKER))
        return found

    def _cards(self, warnings: list[str]) -> list[Card]:
        """User functions, each with the management function of its domain:bus:device."""
        slots: dict[tuple[int, int, int], list[_Function]] = {}
        for address, entry in sorted(self._functions(warnings).items()):
            slots.setdefault((address.domain, address.bus, address.device), []).append(entry)
        cards = []
        for entries in slots.values():
            managers = [e.function for e in entries if e.management]
            management = managers[0] if managers else None
            users = [e for e in entries if e.user and not e.management]
            if users:
                cards += [Card(e.function, management, bound=True) for e in users]
            elif management is not None:
                # The user function is there but xocl is not bound to it (unloaded,
                # unbound, or bound to vfio for a VM): listed, and Unhealthy.
                cards += [Card(e.function, management, bound=False)
                          for e in entries if not e.management]
        return cards

    def _device(self, card: Card, resolver: NodeResolver, warnings: list[str],
                health_files: list[Path]) -> Device:
        user = card.user
        attributes = {"driver": DRIVER, "pci_address": user.bdf}
        if user.vendor:
            attributes["vendor"] = user.vendor
        if user.device:
            attributes["device"] = user.device
        if card.management is not None:
            attributes["management_address"] = card.management.bdf
        reasons: list[str] = []
        nodes = []
        if not card.bound:
            reasons.append(f"{user.path}: xocl driver not bound (no {USER_MARKER}); the runtime "
                           "cannot reach this card")
        else:
            attributes.update(self._shell(user.path, warnings))
            attributes.update(_held(user.path, warnings))
            for name in STATE_FILES:
                health_files.append(user.path / name)
            reasons += _state_problems(user.path)
            for firewall in _subdevices(user.path, FIREWALL_PREFIX)[:MAX_FIREWALLS]:
                status = firewall / "status"
                health_files.append(status)
                problem = _nonzero(read_attr(status), "firewall tripped")
                if problem:
                    reasons.append(problem)
            renders = [name for name in list_dir(user.path / "drm") or []
                       if name.startswith(RENDER_PREFIX)][:MAX_RENDER_NODES]
            if not renders:
                reasons.append(f"{user.path / 'drm'}: no {RENDER_PREFIX}* node registered")
            for name in renders:
                lookup = resolver.resolve(read_attr(user.path / "drm" / name / "dev"), name,
                                          RENDER_DIRECTORY)
                if lookup.warning:
                    warnings.append(lookup.warning)
                if lookup.node is None:
                    reasons.append(lookup.problem)
                else:
                    nodes.append(lookup.node)
        return Device(
            id=user.bdf,
            backend=BACKEND,
            health=Health.UNHEALTHY if reasons else Health.HEALTHY,
            health_reason="; ".join(reasons),
            numa_node=user.numa_node,
            nodes=tuple(nodes),
            attributes=tuple(attributes.items()),
        )

    def _shell(self, function: Path, warnings: list[str]) -> dict[str, str]:
        """The loaded shell's name and build time from the ROM subdevice, where readable."""
        roms = _subdevices(function, ROM_PREFIX)
        if not roms:
            return {}
        shell = {}
        vbnv = read_attr(roms[0] / "VBNV")
        if vbnv.ok and vbnv.text is not None and vbnv.text.isprintable() and len(vbnv.text) <= 128:
            shell["shell"] = vbnv.text
        elif not vbnv.missing:
            warnings.append(f"{vbnv.path}: {vbnv.problem or 'not a shell name'}; shell unknown")
        timestamp = read_attr(roms[0] / "timestamp")
        if timestamp.text is not None and timestamp.text.isdigit() and len(timestamp.text) <= 20:
            shell["shell_timestamp"] = timestamp.text
        elif not timestamp.missing:
            warnings.append(f"{timestamp.path}: {timestamp.problem or 'not a number'}; "
                            "shell timestamp unknown")
        return shell


def _held(function: Path, warnings: list[str]) -> dict[str, str]:
    """The shell's logic and interface UUIDs and the loaded xclbin's UUID, where readable."""
    held: dict[str, str] = {}
    logic = read_attr(function / "logic_uuids")
    if logic.text:
        value = uuid_hex(logic.text.splitlines()[0])
        if value is not None:
            held["logic_uuid"] = value
        else:
            warnings.append(f"{logic.path}: {logic.text[:40]!r} is not a logic UUID; ignoring it")
    elif not logic.ok and not _silent(logic):
        warnings.append(f"{logic.describe()}; logic UUID unknown")
    interfaces = read_attr(function / "interface_uuids")
    lines = (interfaces.text or "").split()
    values = [uuid_hex(line) for line in lines]
    if None in values:
        warnings.append(f"{interfaces.path}: {(interfaces.text or '')[:40]!r} is not a list of "
                        "interface UUIDs; ignoring it")
    elif len(values) == 1 and values[0] is not None:
        held["interface_uuid"] = values[0]
    elif len(values) > 1:
        log.debug("%s: %d interface UUIDs; none recorded", interfaces.path, len(values))
    if not interfaces.ok and not _silent(interfaces):
        warnings.append(f"{interfaces.describe()}; interface UUID unknown")
    xclbin = read_attr(function / "xclbinuuid")
    if xclbin.text:
        text = xclbin.text.lower()
        if not DASHED_UUID.fullmatch(text):
            warnings.append(f"{xclbin.path}: {xclbin.text[:40]!r} is not an xclbin UUID; "
                            "ignoring it")
        elif text != NO_XCLBIN:
            held["xclbin_uuid"] = text
    elif not xclbin.ok and not _silent(xclbin):
        warnings.append(f"{xclbin.describe()}; loaded xclbin unknown")
    return held


def _silent(attr: Attr) -> bool:
    """Absent (older XRT) or empty (no device tree, nothing to tell): not worth a warning."""
    return attr.missing or attr.problem == "empty"


def _subdevices(function: Path, prefix: str) -> list[Path]:
    """The function's ``<prefix><side>.<instance>`` subdevice directories, in name order."""
    return [function / name for name in list_dir(function) or []
            if name.startswith(prefix) and not is_link(function / name)
            and is_dir(function / name)]


def _state_problems(function: Path) -> list[str]:
    problems = []
    ready = read_attr(function / "ready")
    value = _number(ready)
    if not ready.missing and value is None:
        shown = ready.problem or repr((ready.text or "")[:40])
        problems.append(f"{ready.path}: {shown}; readiness unknown")
    elif value == 0:
        problems.append(f"{ready.path} = {ready.text}: card not ready (its management side "
                        "has not brought it up)")
    offline = _nonzero(read_attr(function / "dev_offline"), "card offline")
    if offline:
        problems.append(offline)
    bad = _nonzero(read_attr(function / "device_bad_state"), "card in a bad state")
    if bad:
        problems.append(bad)
    return problems


def _nonzero(attr: Attr, meaning: str) -> str:
    """Why a state file that must read 0 makes the card Unhealthy, or '' if it is fine."""
    if attr.missing:
        return ""
    value = _number(attr)
    if value is None:
        shown = attr.problem or repr((attr.text or "")[:40])
        return f"{attr.path}: {shown}; state unknown"
    if value != 0:
        return f"{attr.path} = {attr.text}: {meaning}"
    return ""


def _number(attr: Attr) -> int | None:
    """A decimal or ``0x`` hexadecimal value, as the drivers print them; None if neither."""
    text = attr.text
    if text is None or len(text) > 24:
        return None
    try:
        if text.lower().lstrip("-").startswith("0x"):
            return int(text, 16)
        return int(text, 10)
    except ValueError:
        return None
