"""Intel FPGA ports from either driver stack: the OPAE ``intel-fpga`` driver and upstream DFL.

OPAE:  ``class/fpga/intel-fpga-dev.N/{intel-fpga-fme.N,intel-fpga-port.M}``, node
       ``intel-fpga-port.M``, interface ID in the FME's ``pr/interface_id``.
DFL:   ``class/fpga_region/regionN/{dfl-fme.K,dfl-port.M}``, node ``dfl-port.M``, interface ID
       in the FME's partial-reconfiguration region ``compat_id`` (or the region's own).

Both hang off a PCI function; an SR-IOV virtual function is a function of its own with its
own card directory and port, and takes the interface ID of its physical function.

Device IDs come from the port's own facts only, never from which other ports exist, so a
port keeps its ID when a sibling goes (hot-unplug, or released to a VF: ``dfl.c`` deletes
the released port's device from the physical function) and a DRA claim or checkpoint that
names an ID always means the same physical port:

* port number 0 is the canonical address of its PCI function (``0000:5e:00.0``);
* the port of an SR-IOV virtual function is the VF's address whatever its number: a VF
  carries exactly one port (``dfl.c``: one port per VF; ``dfl-pci.c`` enumerates a function
  whose BAR 0 starts with a port header as that one port), and that port, the same hardware,
  reads the number it had on the physical function from its own header: port 1 moved to a VF
  is still number 1. A function is a VF if it has a ``physfn`` link (made by
  ``drivers/pci/iov.c``) or a VF device ID of the DFL driver's table (inside a virtual
  machine a passed-through VF has no ``physfn``);
* any other port is ``<address>-port<number>`` (``0000:3b:00.0-port1``).

The number is the port's ``id`` attribute, which both drivers read from the port's own
capability register (``dfl-afu-main.c``; OPAE ``afu.c`` and ``feature-dev.c``). A physical
function's port whose ``id`` cannot be read is not served: the kernel instance number in its
name is no substitute, as it is handed out kernel-wide in enumeration order (``dfl.c``,
lowest free number), changes when the card is enumerated again and may equal another port's
number, which would give that port's ID to this one. Two ports claiming one ID (broken
hardware or tree): the one with the lowest instance number keeps it, the other is skipped
with a warning. The common one port per function gets exactly its address. IDs stay under
30 characters.

Programming: each port of a physical function records the device node of its card's FPGA
Management Engine as ``fme_node`` when that node exists (``/dev/dfl-fme.N``: the FME platform
device gets a character device of that name in ``dfl.c``, ``dfl_devs[]``, and a ``dev``
attribute with it; OPAE names it ``/dev/intel-fpga-fme.N``). Partial reconfiguration of a
port goes through that node (``DFL_FPGA_FME_PORT_PR``), so without it the port cannot be
given another function here (:mod:`plugin.model.programming`). A missing node is no health
matter: the port still serves what it holds.

Health is recomputed from scratch on every scan, so a port recovers as soon as its cause
clears: an all-``f`` AFU ID, a non-zero ``errors/errors`` or a missing device node each make
the port Unhealthy, with the reason (and the path) in ``health_reason``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from plugin.discovery.backends.base import BackendConfig
from plugin.discovery.backends.devnodes import NodeResolver
from plugin.discovery.backends.hexid import is_all_f, normalise_hex_id
from plugin.discovery.backends.intel_cards import CardModel, card_model, needs_subsystem
from plugin.discovery.backends.pcifn import PciFunction, owning_function, pci_id, read_function
from plugin.discovery.backends.sysfs import Notes, is_dir, list_dir, read_attr
from plugin.model.programming import FME_NODE
from value_types.devices import Device, Health

log = logging.getLogger(__name__)

BACKEND = "intel"
AFU_CRASHED = "AFU ID is all f: firmware crashed"


@dataclass(frozen=True)
class Layout:
    """Where one driver stack puts its cards, ports and management engines."""

    driver: str
    class_dir: str
    card: re.Pattern[str]
    port: re.Pattern[str]
    port_prefix: str
    fme: re.Pattern[str]


OPAE = Layout(
    driver="intel-fpga",
    class_dir="class/fpga",
    card=re.compile(r"^intel-fpga-dev\.(\d+)$"),
    port=re.compile(r"^intel-fpga-port\.(\d+)$"),
    port_prefix="intel-fpga-port",
    fme=re.compile(r"^intel-fpga-fme\.(\d+)$"),
)
DFL = Layout(
    driver="dfl",
    class_dir="class/fpga_region",
    card=re.compile(r"^region(\d+)$"),
    port=re.compile(r"^dfl-port\.(\d+)$"),
    port_prefix="dfl-port",
    fme=re.compile(r"^dfl-fme\.(\d+)$"),
)
LAYOUTS = (OPAE, DFL)


@dataclass(frozen=True, slots=True)
class Port:
    name: str
    instance: int
    path: Path


@dataclass(frozen=True, slots=True)
class Card:
    """One driver directory of one PCI function, with its ports and FME interface ID."""

    layout: Layout
    path: Path
    function: PciFunction
    interface_id: str | None
    ports: tuple[Port, ...]
    model: CardModel | None = None
    fmes: tuple[Path, ...] = ()
    """The card's FME directories (one on real cards; none on a virtual function)."""


@dataclass(frozen=True, slots=True)
class NamedPort:
    """A port with the ID its own facts give it; ``number`` orders a function's ports."""

    card: Card
    port: Port
    device_id: str
    number: int


class IntelBackend:
    """Scans both layouts on every call; keeps no state between scans but reported warnings."""

    name = BACKEND
    static = False
    uevent_subsystems = ("pci", "fpga", "fpga_region", "platform")

    def __init__(self, config: BackendConfig) -> None:
        self.sysfs_root = config.sysfs_root
        self.dev_root = config.dev_root
        self._notes = Notes(log)
        self._health_files: tuple[Path, ...] = ()
        self._seen_health_files: list[Path] = []

    def scan(self) -> list[Device]:
        warnings = self._notes.start()
        self._seen_health_files = []
        try:
            devices = self._scan(warnings)
            self._health_files = tuple(self._seen_health_files)
        except Exception:
            log.exception("Intel FPGA discovery under %s failed; reporting no ports",
                          self.sysfs_root)
            devices = []
        self._notes.flush(warnings)
        return devices

    def health_files(self) -> list[Path]:
        """Each served port's ``afu_id`` and error register, as found by the last scan.

        Their contents decide health but change without any event (a crashed AFU, a latched
        error), so the monitor re-reads just these between full scans.
        """
        return list(self._health_files)

    def watch_paths(self) -> list[Path]:
        """Device-node directories (udev adds and removes nodes) and the class directories."""
        candidates = [self.sysfs_root / layout.class_dir for layout in LAYOUTS]
        candidates += [self.dev_root, self.dev_root / "char"]
        return [path for path in candidates if is_dir(path)]

    def places(self) -> list[Path]:
        """Where ports are looked for, for messages that say what was searched."""
        return [self.sysfs_root / layout.class_dir for layout in LAYOUTS]

    def _scan(self, warnings: list[str]) -> list[Device]:
        cards = [card for layout in LAYOUTS for card in self._cards(layout, warnings)]
        interfaces = {c.function.bdf: c.interface_id for c in cards if c.interface_id}
        named = [entry for card in cards for port in card.ports
                 if (entry := name_port(card, port, warnings)) is not None]
        # Lowest instance first among ports claiming one ID, so which keeps it is decided
        # by the kernel's names, not by the order directories are listed in.
        named.sort(key=lambda e: (e.card.function.bdf, e.number, e.port.instance))
        devices: list[Device] = []
        nodes = NodeResolver(self.dev_root)
        taken: dict[str, NamedPort] = {}
        for entry in named:
            holder = taken.get(entry.device_id)
            if holder is not None:
                warnings.append(
                    f"{entry.port.path}: {entry.device_id} already names {holder.port.name} "
                    f"(two ports of one function with one number); skipping {entry.port.name}"
                )
                continue
            taken[entry.device_id] = entry
            interface = entry.card.interface_id or _parent_interface(entry.card, interfaces)
            try:
                devices.append(self._device(entry, interface, nodes, warnings))
            except ValueError as exc:  # the model refused a value: lose this port only
                warnings.append(f"{entry.port.path}: {exc}; skipping {entry.port.name}")
        return devices

    def _cards(self, layout: Layout, warnings: list[str]) -> Iterator[Card]:
        class_dir = self.sysfs_root / layout.class_dir
        names = list_dir(class_dir)
        if names is None:
            if is_dir(class_dir):
                warnings.append(f"{class_dir}: cannot be listed; no {layout.driver} ports found")
            return
        for name in names:
            match = layout.card.match(name)
            if match is None:
                log.debug("%s: not a %s card directory, ignored", class_dir / name, layout.driver)
                continue
            card = self._card(layout, class_dir / name, warnings)
            if card is not None:
                yield card

    def _card(self, layout: Layout, entry: Path, warnings: list[str]) -> Card | None:
        children = list_dir(entry)
        if children is None:
            warnings.append(f"{entry}: cannot be listed (broken link or loop?); skipping it")
            return None
        ports = []
        for child in children:
            match = layout.port.match(child)
            if match is not None:
                ports.append(Port(child, int(match[1]), entry / child))
            elif child.startswith(layout.port_prefix):
                warnings.append(f"{entry / child}: not a {layout.port_prefix}.N name; skipping it")
        fmes = [entry / c for c in children if layout.fme.match(c)]
        if not ports and not fmes:
            return None
        owner = owning_function(entry)
        if owner is None:
            if ports:
                warnings.append(
                    f"{entry}: no PCI function found (no 'device' link to, and no parent "
                    f"directory named, dddd:bb:dd.f); skipping {', '.join(p.name for p in ports)}"
                )
            return None
        function = read_function(*owner, warnings)
        subsystem = None
        if needs_subsystem(function.vendor, function.device):  # OFS: one device ID, many cards
            subsystem = pci_id(read_attr(function.path / "subsystem_device"), warnings)
        return Card(layout, entry, function, _interface_id(layout, entry, fmes, warnings),
                    tuple(ports), card_model(function.vendor, function.device, subsystem),
                    tuple(sorted(fmes)))

    def _device(self, entry: NamedPort, interface_id: str | None, nodes: NodeResolver,
                warnings: list[str]) -> Device:
        card, port, function = entry.card, entry.port, entry.card.function
        device_id = entry.device_id
        reasons: list[str] = []
        attributes = {
            "driver": card.layout.driver,
            "port": port.name,
            "port_number": str(entry.number),
            "pci_address": function.bdf,
        }
        if function.vendor:
            attributes["vendor"] = function.vendor
        if function.device:
            attributes["device"] = function.device
        if interface_id:
            attributes["interface_id"] = interface_id
        if card.model is not None:
            attributes["card"] = card.model.name
        fme_node = _fme_node(card, nodes, warnings)
        if fme_node:
            attributes[FME_NODE] = fme_node
        self._seen_health_files += [port.path / "afu_id", port.path / "errors" / "errors"]
        afu_id = _afu_id(device_id, port, reasons, warnings)
        if afu_id:
            attributes["afu_id"] = afu_id
        _check_errors(device_id, port, reasons, warnings)
        lookup = nodes.resolve(read_attr(port.path / "dev"), port.name)
        if lookup.warning:
            warnings.append(lookup.warning)
        if lookup.node is None:
            reasons.append(lookup.problem)
        return Device(
            id=device_id,
            backend=BACKEND,
            health=Health.UNHEALTHY if reasons else Health.HEALTHY,
            health_reason="; ".join(reasons),
            numa_node=function.numa_node,
            nodes=(lookup.node,) if lookup.node is not None else (),
            attributes=tuple(attributes.items()),
        )


def name_port(card: Card, port: Port, warnings: list[str]) -> NamedPort | None:
    """The port's ID from its function and its own number (see the module docstring);
    None, with a warning, for a physical function's port whose number cannot be read."""
    bdf = card.function.bdf
    if is_virtual_function(card):
        return NamedPort(card, port, bdf, 0)
    number = port_number(port, warnings)
    if number is None:
        return None
    return NamedPort(card, port, bdf if number == 0 else f"{bdf}-port{number}", number)


def is_virtual_function(card: Card) -> bool:
    """Whether the card's function is an SR-IOV VF, and so holds exactly one port.

    Either fact is the kernel's: the ``physfn`` link exists only on a VF, and the VF device
    IDs of ``dfl-pci.c`` are never a physical function's. Neither can make a physical
    function look like a VF, which would let its port N take port 0's ID.
    """
    model = card.model
    return card.function.physfn is not None or (model is not None and model.virtual_function)


def port_number(port: Port, warnings: list[str]) -> int | None:
    """The hardware port number (``id``); None, with a warning, if it cannot be read.

    Both drivers create ``id`` when their port driver binds, together with the device node,
    so a port without one is not usable yet (or is going: then it is left out quietly).
    """
    attr = read_attr(port.path / "id")
    if attr.text is not None and attr.text.isdigit() and len(attr.text) <= 6:
        return int(attr.text)
    if attr.missing and not is_dir(port.path):
        log.debug("%s: gone while scanning", port.path)
        return None
    shown = attr.describe() if attr.text is None else f"{attr.path}: {attr.text[:40]!r}"
    warnings.append(f"{shown} is not a port number; {port.name} is not served until it has "
                    f"one (its instance number could name another port)")
    return None


def _afu_id(device_id: str, port: Port, reasons: list[str], warnings: list[str]) -> str | None:
    attr = read_attr(port.path / "afu_id")
    value = normalise_hex_id(attr.text) if attr.text is not None else None
    if value is None:
        problem = attr.describe() if attr.text is None else (
            f"{attr.path}: {attr.text[:40]!r} is not a hex AFU ID")
        reasons.append(f"AFU ID unreadable: {problem}")
        warnings.append(f"{device_id} ({port.name}): AFU ID unreadable: {problem}")
        return None
    if is_all_f(value):
        reasons.append(AFU_CRASHED)
    return value


def _check_errors(device_id: str, port: Port, reasons: list[str], warnings: list[str]) -> None:
    """A non-zero port error register makes the port Unhealthy; no register, no check."""
    attr = read_attr(port.path / "errors" / "errors")
    if attr.missing:
        return
    value = _register(attr.text) if attr.text is not None else None
    if value is None:
        problem = attr.describe() if attr.text is None else (
            f"{attr.path}: {attr.text[:40]!r} is not a register value")
        reasons.append(f"port error register unreadable: {problem}")
        warnings.append(f"{device_id} ({port.name}): port error register unreadable: {problem}")
    elif value != 0:
        reasons.append(f"port error register {attr.path} reads {value:#x}")


def _register(text: str) -> int | None:
    try:
        return int(text, 16)
    except ValueError:
        return None


def _interface_id(layout: Layout, card: Path, fmes: list[Path],
                  warnings: list[str]) -> str | None:
    """The FME's interface (compat) ID: what a bitstream must match to be loaded here."""
    candidates: list[Path] = []
    for fme in fmes:
        if layout is OPAE:
            candidates.append(fme / "pr" / "interface_id")
        else:
            candidates += _dfl_pr_regions(fme)
    if layout is DFL:
        candidates.append(card / "compat_id")
    for path in candidates:
        attr = read_attr(path)
        if attr.missing:
            continue
        value = normalise_hex_id(attr.text) if attr.text is not None else None
        if value is not None:
            return value
        shown = attr.describe() if attr.text is None else f"{attr.path}: {attr.text[:40]!r}"
        warnings.append(f"{shown} is not an interface ID; ignoring it")
    return None


def _fme_node(card: Card, nodes: NodeResolver, warnings: list[str]) -> str | None:
    """The host path of the card's FME device node, or None when it has none now.

    A malformed ``dev`` attribute is reported (the resolver's warning) and the node is
    looked for by name, as for ports; a missing node is only logged at debug level, since
    programming is an option and the port is served either way.
    """
    for fme in card.fmes:
        lookup = nodes.resolve(read_attr(fme / "dev"), fme.name)
        if lookup.warning:
            warnings.append(lookup.warning)
        if lookup.node is not None:
            return lookup.node.host_path
        log.debug("%s: %s; its ports cannot be programmed", fme, lookup.problem)
    return None


def _dfl_pr_regions(fme: Path) -> list[Path]:
    """``dfl-fme.K/dfl-fme-region.J/fpga_region/regionR/compat_id`` for every PR region."""
    found = []
    for sub in list_dir(fme) or []:
        if not sub.startswith("dfl-fme-region."):
            continue
        regions = fme / sub / "fpga_region"
        found += [regions / r / "compat_id" for r in list_dir(regions) or []
                  if DFL.card.match(r)]
    return found


def _parent_interface(card: Card, interfaces: dict[str, str | None]) -> str | None:
    """A virtual function has no FME; it runs in the region of its physical function."""
    physfn = card.function.physfn
    return interfaces.get(str(physfn)) if physfn is not None else None
