"""Fake sysfs and /dev trees, laid out like the kernel and udev lay them out, under any directory.

Tests and the demo need nodes with cards, virtual functions, NUMA nodes, F1 and F2 instances and
broken hardware, without root and without ``mknod``. The trees follow the real layouts
closely (relative symlinks from ``class/`` and ``bus/pci/devices`` into ``devices/``, a
``device`` link from each card to its PCI function, ``physfn``/``virtfnN`` links for SR-IOV),
so the backends run the same code on them as on a real node.

Device nodes are empty regular files ``<dev-root>/<name>`` plus the udev-style link
``<dev-root>/char/MAJ:MIN -> ../<name>``; see :mod:`plugin.discovery.backends.devnodes` for how they
are resolved. Mutation helpers change a tree the way the kernel and udev would (removing a
port removes its node too), so the plugin's watchers see the same kind of events.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from compat_tests.fake_aws import AMAZON_VENDOR, AwsSlots
from compat_tests.fake_aws import F1_CLEARED as F1_CLEARED
from compat_tests.fake_aws import F1_MANAGEMENT as F1_MANAGEMENT
from compat_tests.fake_aws import F2_CLEARED as F2_CLEARED
from compat_tests.fake_aws import F2_MANAGEMENT as F2_MANAGEMENT
from compat_tests.fake_tree import pci_address, relative_link, write_file
from plugin.discovery.backends.base import BackendConfig
from plugin.discovery.backends.pci import PciAddress

DEFAULT_AFU_ID = "d8424dc4a4a3c413f89e433683f9040b"
OTHER_AFU_ID = "9e1f4ab2c6d3487a8b0e5f1a2c3d4e5f"
CRASHED_AFU_ID = "f" * 32
DEFAULT_INTERFACE_ID = "3a00972ec9bf4b2a8e3c1c5e5a6f0d11"
INTEL_VENDOR = "0x8086"
FPGA_CLASS = "0x120000"
MAJORS = {"intel-fpga": 240, "dfl": 508}
FME_MAJORS = {"intel-fpga": 241, "dfl": 509}
"""The FME's character devices have a major of their own (``dfl.c`` registers one chrdev
region per feature device type, ``dfl_chrdevs[]``)."""


@dataclass
class FakePort:
    name: str
    driver: str
    bdf: str
    path: Path
    dev: str


@dataclass
class FakeCard:
    driver: str
    bdf: str
    path: Path
    class_link: Path
    ports: list[str] = field(default_factory=list)
    fme: Path | None = None
    """The FME's sysfs directory (``intel-fpga-fme.N`` / ``dfl-fme.N``); None on a VF."""


class FakeNode(AwsSlots):
    """A node's ``sys`` and ``dev`` trees under ``root``; see the module docstring."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.sysfs_root = self.root / "sys"
        self.dev_root = self.root / "dev"
        for path in (self.sysfs_root / "devices", self.sysfs_root / "bus" / "pci" / "devices",
                     self.sysfs_root / "class" / "fpga", self.sysfs_root / "class" / "fpga_region",
                     self.dev_root / "char"):
            path.mkdir(parents=True, exist_ok=True)
        self.ports: dict[str, FakePort] = {}
        self.cards: dict[str, FakeCard] = {}
        self.slots: list[tuple[str, str]] = []
        self._next = {"intel-fpga-dev": 0, "intel-fpga-fme": 0, "intel-fpga-port": 0,
                      "region": 0, "dfl-fme": 0, "dfl-port": 0}
        self._minor = {"intel-fpga": 0, "dfl": 0}
        self._fme_minor = {"intel-fpga": 0, "dfl": 0}

    def config(self, nb_units: int = 40) -> BackendConfig:
        return BackendConfig(sysfs_root=self.sysfs_root, dev_root=self.dev_root,
                             nb_units=nb_units)

    # PCI functions ----------------------------------------------------------------------

    def function_path(self, bdf: str) -> Path:
        address = pci_address(bdf)
        return self.sysfs_root / "devices" / f"pci{address.domain:04x}:{address.bus:02x}" / str(
            address)

    def add_function(self, bdf: str, vendor: str, device: str, numa_node: int = -1,
                     pci_class: str = FPGA_CLASS, physfn: str | None = None,
                     subsystem_device: str | None = None) -> Path:
        """A PCI function directory, listed in ``bus/pci/devices`` like the kernel does."""
        path = self.function_path(bdf)
        path.mkdir(parents=True, exist_ok=True)
        for name, value in (("vendor", vendor), ("device", device), ("class", pci_class),
                            ("numa_node", str(numa_node))):
            write_file(path / name, value)
        if subsystem_device is not None:
            write_file(path / "subsystem_vendor", vendor)
            write_file(path / "subsystem_device", subsystem_device)
        relative_link(self.sysfs_root / "bus" / "pci" / "devices" / str(pci_address(bdf)), path)
        if physfn is not None:
            parent = self.function_path(physfn)
            relative_link(path / "physfn", parent)
            index = len([p for p in parent.iterdir() if p.name.startswith("virtfn")])
            relative_link(parent / f"virtfn{index}", path)
        return path

    def remove_function(self, bdf: str) -> None:
        canonical = str(pci_address(bdf))
        (self.sysfs_root / "bus" / "pci" / "devices" / canonical).unlink(missing_ok=True)
        shutil.rmtree(self.function_path(bdf), ignore_errors=True)

    # Intel cards ------------------------------------------------------------------------

    def add_opae_card(self, bdf: str, *, ports: int = 1, vfs: int = 0, numa_node: int = 0,
                      device: str = "0x09c4", vf_device: str = "0x09c5",
                      afu_id: str = DEFAULT_AFU_ID,
                      interface_id: str | None = DEFAULT_INTERFACE_ID) -> list[str]:
        """An OPAE card; with ``vfs`` its ports move to that many virtual functions."""
        return self._add_card("intel-fpga", bdf, ports, vfs, numa_node, device, vf_device,
                              afu_id, interface_id)

    def add_dfl_card(self, bdf: str, *, ports: int = 1, vfs: int = 0, numa_node: int = 0,
                     device: str = "0x0b2b", vf_device: str = "0x0b2c",
                     subsystem_device: str | None = None, afu_id: str = DEFAULT_AFU_ID,
                     interface_id: str | None = DEFAULT_INTERFACE_ID) -> list[str]:
        """A card driven by upstream DFL (a PAC D5005 unless IDs say otherwise: an Agilex
        N6001 is ``device="0xbcce", vf_device="0xbccf", subsystem_device="0x1771"``);
        ``vfs`` works as for :meth:`add_opae_card`. With ``interface_id=None`` the card has
        no FME, as a virtual function passed through to a virtual machine looks from inside
        it (a VF ``device`` and no ``physfn`` link: the host keeps the physical function)."""
        return self._add_card("dfl", bdf, ports, vfs, numa_node, device, vf_device,
                              afu_id, interface_id, subsystem_device)

    def _add_card(self, driver: str, bdf: str, ports: int, vfs: int, numa_node: int,
                  device: str, vf_device: str, afu_id: str, interface_id: str | None,
                  subsystem_device: str | None = None) -> list[str]:
        canonical = str(pci_address(bdf))
        self.add_function(canonical, INTEL_VENDOR, device, numa_node,
                          subsystem_device=subsystem_device)
        self._card(driver, canonical, interface_id)
        names: list[str] = []
        if vfs == 0:
            names += [self.add_port(canonical, afu_id=afu_id) for _ in range(ports)]
        pf = pci_address(canonical)
        for index in range(vfs):
            vf = str(PciAddress(pf.domain, pf.bus, pf.device, index + 1))
            self.add_function(vf, INTEL_VENDOR, vf_device, numa_node, physfn=canonical,
                              subsystem_device=subsystem_device)
            self._card(driver, vf, None)
            names.append(self.add_port(vf, afu_id=afu_id, port_id=index))
        return names

    def _card(self, driver: str, bdf: str, interface_id: str | None) -> FakeCard:
        function = self.function_path(bdf)
        fme: Path | None = None
        if driver == "intel-fpga":
            name = self._take("intel-fpga-dev", "intel-fpga-dev.{}")
            path = function / "fpga" / name
            path.mkdir(parents=True)
            if interface_id is not None:
                fme = path / self._take("intel-fpga-fme", "intel-fpga-fme.{}")
                write_file(fme / "pr" / "interface_id", interface_id)
            class_link = self.sysfs_root / "class" / "fpga" / name
        else:
            name = self._take("region", "region{}")
            path = function / "fpga_region" / name
            path.mkdir(parents=True)
            if interface_id is not None:
                fme_name = self._take("dfl-fme", "dfl-fme.{}")
                fme = path / fme_name
                fme_region = fme / f"dfl-fme-region.{fme_name.split('.')[1]}"
                pr_name = self._take("region", "region{}")
                pr = fme_region / "fpga_region" / pr_name
                write_file(pr / "compat_id", interface_id)
                relative_link(pr / "device", fme_region)
                relative_link(self.sysfs_root / "class" / "fpga_region" / pr_name, pr)
            class_link = self.sysfs_root / "class" / "fpga_region" / name
        relative_link(class_link, path)
        relative_link(path / "device", function)
        card = FakeCard(driver, bdf, path, class_link, fme=fme)
        self.cards[bdf] = card
        if fme is not None:
            minor = self._fme_minor[driver]
            self._fme_minor[driver] += 1
            write_file(fme / "dev", f"{FME_MAJORS[driver]}:{minor}")
            self.restore_fme_node(bdf)
        return card

    def fme_dev(self, bdf: str) -> str:
        fme = self.cards[bdf].fme
        assert fme is not None, f"{bdf} has no FME"
        return (fme / "dev").read_text().strip()

    def delete_fme_node(self, bdf: str) -> None:
        """The FME's device node goes (udev rule, or a node not passed into the container)."""
        fme = self.cards[bdf].fme
        assert fme is not None, f"{bdf} has no FME"
        (self.dev_root / fme.name).unlink(missing_ok=True)
        (self.dev_root / "char" / self.fme_dev(bdf)).unlink(missing_ok=True)

    def restore_fme_node(self, bdf: str) -> None:
        fme = self.cards[bdf].fme
        assert fme is not None, f"{bdf} has no FME"
        write_file(self.dev_root / fme.name, "")
        relative_link(self.dev_root / "char" / self.fme_dev(bdf), self.dev_root / fme.name)

    def add_port(self, bdf: str, *, afu_id: str = DEFAULT_AFU_ID,
                 port_id: int | None = None) -> str:
        """A new port on the card of function ``bdf``, with its device node; returns its name."""
        card = self.cards[str(pci_address(bdf))]
        prefix = "intel-fpga-port" if card.driver == "intel-fpga" else "dfl-port"
        name = self._take(prefix, prefix + ".{}")
        if port_id is None:
            used = [int((self.ports[p].path / "id").read_text()) for p in card.ports]
            port_id = max(used, default=-1) + 1
        path = card.path / name
        minor = self._minor[card.driver]
        self._minor[card.driver] += 1
        dev = f"{MAJORS[card.driver]}:{minor}"
        write_file(path / "afu_id", afu_id)
        write_file(path / "dev", dev)
        write_file(path / "id", str(port_id))
        write_file(path / "errors" / "errors", "0x0")
        self.ports[name] = FakePort(name, card.driver, card.bdf, path, dev)
        card.ports.append(name)
        self.restore_device_node(name)
        return name

    def remove_port(self, name: str) -> None:
        """The port and its device node disappear, as on driver unbind or card removal."""
        port = self.ports.pop(name)
        self.cards[port.bdf].ports.remove(name)
        self.delete_device_node(name)
        shutil.rmtree(port.path)

    def release_port_to_vf(self, name: str, vf_device: str | None = None) -> tuple[str, str]:
        """Port ``name`` moves from its physical function to a new virtual function of it.

        As SR-IOV does it on a multi-port card: the port leaves the physical function
        (``dfl_fpga_cdev_release_port()`` in drivers/fpga/dfl.c deletes its platform
        device, node included) and comes back as the one port of a new VF, under a new
        kernel instance number but with the same hardware port number (``id``), which the
        port reads from its own header. Returns the VF's address and the new port's name.
        """
        port = self.ports[name]
        card = self.cards[port.bdf]
        number = int((port.path / "id").read_text())
        afu_id = (port.path / "afu_id").read_text().strip()
        pf = pci_address(port.bdf)
        parent = self.function_path(port.bdf)
        numa = int((parent / "numa_node").read_text())
        index = len([p for p in parent.iterdir() if p.name.startswith("virtfn")])
        vf = str(PciAddress(pf.domain, pf.bus, pf.device, index + 1))
        if vf_device is None:
            vf_device = "0x09c5" if card.driver == "intel-fpga" else "0x0b2c"
        self.remove_port(name)
        self.add_function(vf, INTEL_VENDOR, vf_device, numa, physfn=port.bdf)
        self._card(card.driver, vf, None)
        return vf, self.add_port(vf, afu_id=afu_id, port_id=number)

    def port_path(self, name: str) -> Path:
        return self.ports[name].path

    def port_class_path(self, name: str) -> Path:
        """The port as reached from ``class/``, the spelling discovery's messages use."""
        port = self.ports[name]
        return self.cards[port.bdf].class_link / name

    def set_afu_id(self, name: str, afu_id: str) -> None:
        write_file(self.ports[name].path / "afu_id", afu_id)

    def set_port_error(self, name: str, value: int | str) -> None:
        text = f"{value:#x}" if isinstance(value, int) else value
        write_file(self.ports[name].path / "errors" / "errors", text)

    def delete_device_node(self, name: str) -> None:
        port = self.ports.get(name)
        (self.dev_root / name).unlink(missing_ok=True)
        if port is not None:
            (self.dev_root / "char" / port.dev).unlink(missing_ok=True)

    def restore_device_node(self, name: str) -> None:
        port = self.ports[name]
        write_file(self.dev_root / name, "")
        relative_link(self.dev_root / "char" / port.dev, self.dev_root / name)

    def _take(self, counter: str, pattern: str) -> str:
        number = self._next[counter]
        self._next[counter] += 1
        return pattern.format(number)


# Ready-made nodes ---------------------------------------------------------------------------

F1_16XLARGE_SLOTS = tuple(f"0000:00:{0x0f + 2 * i:02x}.0" for i in range(8))


def build_intel_node(root: Path) -> FakeNode:
    """Six ports on NUMA nodes 0 and 1, both drivers, SR-IOV and a two-port function.

    ``0000:5e:00.0`` OPAE, NUMA 0; ``0000:3b:00.0`` DFL with two ports (IDs ``0000:3b:00.0``
    and ``0000:3b:00.0-port1``), NUMA 0; ``0000:be:00.1`` and ``0000:be:00.2`` virtual
    functions of an OPAE card, NUMA 1; ``0000:d8:00.0`` DFL with another AFU, NUMA 1.
    """
    node = FakeNode(root)
    node.add_opae_card("0000:5e:00.0", numa_node=0)
    node.add_dfl_card("0000:3b:00.0", ports=2, numa_node=0)
    node.add_opae_card("0000:be:00.0", vfs=2, numa_node=1)
    node.add_dfl_card("0000:d8:00.0", numa_node=1, afu_id=OTHER_AFU_ID)
    return node


def _amazon_instance(root: Path) -> FakeNode:
    """A node with the network (ENA) and NVMe functions every AWS instance has, which share
    Amazon's vendor ID with the FPGA slots."""
    node = FakeNode(root)
    node.add_function("0000:00:03.0", AMAZON_VENDOR, "0xec20", 0, pci_class="0x020000")
    node.add_function("0000:00:04.0", AMAZON_VENDOR, "0x8061", 0, pci_class="0x010802")
    return node


def build_f1_16xlarge(root: Path) -> FakeNode:
    """Eight F1 slots (0-3 on NUMA 0, 4-7 on NUMA 1) among Amazon's network and disk functions."""
    node = _amazon_instance(root)
    for index, bdf in enumerate(F1_16XLARGE_SLOTS):
        node.add_slot(bdf, numa_node=0 if index < 4 else 1)
    return node


F2_48XLARGE_SLOTS = tuple(f"0000:{bus:02x}:00.0" for bus in (0x34, 0x35, 0x36, 0x37,
                                                             0xb4, 0xb5, 0xb6, 0xb7))
"""Illustrative addresses, one FPGA per bus as in aws-fpga's README example (``0000:34:00.0``);
the real f2.48xlarge addresses were not established."""


def build_f2_48xlarge(root: Path) -> FakeNode:
    """Eight F2 slots (0-3 on NUMA 0, 4-7 on NUMA 1) among Amazon's network and disk functions.

    Each slot is a cleared application function at ``F2_48XLARGE_SLOTS[i]`` with its
    management function at function 1 of the same device.
    """
    node = _amazon_instance(root)
    for index, bdf in enumerate(F2_48XLARGE_SLOTS):
        node.add_f2_slot(bdf, numa_node=0 if index < 4 else 1)
    return node


def build_broken_node(root: Path) -> FakeNode:
    """One healthy port and every kind of trouble discovery must survive.

    Served, Unhealthy: ``0000:3b:00.0`` (AFU ID all f), ``0000:5e:00.0`` (port error 0x4),
    ``0000:86:00.0`` (device node missing), ``0000:af:00.0`` (garbage AFU ID).
    Served, healthy, NUMA unknown: ``0000:d8:00.0`` (garbage ``numa_node``).
    Skipped with a warning: a card whose parents are not PCI functions, a dangling class
    link, a class link that loops, a port with a malformed name.
    """
    node = FakeNode(root)
    node.add_dfl_card("0000:3b:00.0", afu_id=CRASHED_AFU_ID)
    [errored] = node.add_opae_card("0000:5e:00.0")
    node.set_port_error(errored, 0x4)
    [nodeless] = node.add_dfl_card("0000:86:00.0", numa_node=1)
    node.delete_device_node(nodeless)
    node.add_opae_card("0000:af:00.0", afu_id="not-an-afu-id", numa_node=1)
    node.add_dfl_card("0000:d8:00.0", numa_node=1)
    write_file(node.function_path("0000:d8:00.0") / "numa_node", "banana")
    node.add_dfl_card("0000:12:00.0")
    orphan = node.sysfs_root / "devices" / "platform" / "fpga-sim" / "fpga" / "intel-fpga-dev.90"
    write_file(orphan / "intel-fpga-port.90" / "afu_id", DEFAULT_AFU_ID)
    write_file(orphan / "intel-fpga-port.90" / "dev", "240:90")
    relative_link(node.sysfs_root / "class" / "fpga" / "intel-fpga-dev.90", orphan)
    relative_link(node.sysfs_root / "class" / "fpga" / "intel-fpga-dev.91",
          node.sysfs_root / "devices" / "gone")
    loop = node.sysfs_root / "class" / "fpga_region" / "region90"
    os.symlink("region91", loop)
    os.symlink("region90", loop.parent / "region91")
    write_file(node.cards["0000:12:00.0"].path / "dfl-port.x" / "afu_id", DEFAULT_AFU_ID)
    return node


def build_ports(root: Path, count: int, driver: str = "dfl") -> FakeNode:
    """``count`` single-port cards (for benchmarks), spread over NUMA nodes 0 and 1."""
    node = FakeNode(root)
    add = node.add_dfl_card if driver == "dfl" else node.add_opae_card
    for index in range(count):
        add(f"0000:{0x10 + index // 32:02x}:{index % 32:02x}.0", numa_node=index % 2)
    return node


