"""Fake Alveo cards, laid out as XRT's drivers lay them out, on a :class:`FakeNode`.

What a card looks like (see :mod:`plugin.discovery.backends.alveo` for the driver sources): a
management function (``xclmgmt``) at function 0 and a user function (``xocl``) at function 1
of one domain:bus:device, as shells since 2018.3 have them; marker files ``mgmt_pf`` and
``user_pf``; the management side's ``instance`` (``(domain << 16) | (bus << 8) | devfn``,
``XOCL_DEV_ID``); subdevices ``rom.u.<n>`` (``VBNV``, ``timestamp``) and
``firewall.u.<n>`` (``status``) whose instance numbers run across cards; the user function's
``logic_uuids`` and ``interface_uuids`` (32 hex digits a line, as the shell's device tree
holds them) and ``xclbinuuid`` (``%pUb``, all zeros with no xclbin loaded), as
``userpf/xocl_sysfs.c`` prints them; the user
function's DRM nodes ``drm/card<n>`` and ``drm/renderD<128+n>`` (major 226), with
``/dev/dri/renderD<N>`` and its ``/dev/char`` link. The default IDs are a pair from XRT's
tables (``devices.h``: management ``0x5004``, user ``0x5005``, vendor ``0x10ee``).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from compat_tests.fake_sysfs import FakeNode
from compat_tests.fake_tree import pci_address, relative_link, write_file
from plugin.discovery.backends.pci import PciAddress

XILINX_VENDOR = "0x10ee"
MANAGEMENT_DEVICE = "0x5004"
USER_DEVICE = "0x5005"
DEFAULT_SHELL = "xilinx_u250_gen3x16_xdma_shell_4_1"
DEFAULT_TIMESTAMP = "1605029394"
DEFAULT_LOGIC_UUID = "f465b0a3ae8c64f619bc150384ace69b"
DEFAULT_INTERFACE_UUID = "862c7020a250293e32036f19956669e5"
NO_XCLBIN = "00000000-0000-0000-0000-000000000000"
DRM_MAJOR = 226
RENDER_MINOR_BASE = 128
FIREWALL_INSTANCE_BASE = 16 << 20
"""XRT numbers subdevice instances from ``subdev_id << MINORBITS``; the AXI firewall is 16."""
ACCELERATOR_CLASS = "0x120000"


@dataclass
class FakeAlveo:
    user: str
    management: str
    render: str
    dev: str


def _cards(node: FakeNode) -> dict[str, FakeAlveo]:
    """The node's cards by user address, kept on the node itself."""
    cards: dict[str, FakeAlveo] | None = getattr(node, "alveo_cards", None)
    if cards is None:
        cards = {}
        node.alveo_cards = cards  # type: ignore[attr-defined]
    return cards


def add_alveo_card(node: FakeNode, user_bdf: str, *, numa_node: int = 0,
                   vendor: str = XILINX_VENDOR, user_device: str = USER_DEVICE,
                   management_device: str = MANAGEMENT_DEVICE, shell: str = DEFAULT_SHELL,
                   timestamp: str = DEFAULT_TIMESTAMP, xocl: bool = True) -> FakeAlveo:
    """A card whose user function is ``user_bdf`` (its management function is function 0)."""
    user = pci_address(user_bdf)
    management = PciAddress(user.domain, user.bus, user.device, 0)
    if management == user:
        raise ValueError(f"{user_bdf}: the user function of a card is not function 0")
    cards = _cards(node)
    index = len(cards)
    mgmt_path = node.add_function(str(management), vendor, management_device, numa_node,
                                  pci_class=ACCELERATOR_CLASS)
    write_file(mgmt_path / "mgmt_pf", "")
    instance = (management.domain << 16) | (management.bus << 8) | (management.device << 3)
    write_file(mgmt_path / "instance", str(instance | management.function))
    write_file(mgmt_path / "ready", "1")
    _driver(node, mgmt_path, "xclmgmt")
    node.add_function(str(user), vendor, user_device, numa_node, pci_class=ACCELERATOR_CLASS)
    minor = RENDER_MINOR_BASE + index
    card = FakeAlveo(str(user), str(management), f"renderD{minor}", f"{DRM_MAJOR}:{minor}")
    cards[card.user] = card
    if xocl:
        bind_xocl(node, card.user, shell=shell, timestamp=timestamp)
    return card


def bind_xocl(node: FakeNode, user_bdf: str, *, shell: str = DEFAULT_SHELL,
              timestamp: str = DEFAULT_TIMESTAMP) -> None:
    """What xocl creates when it binds: marker, state files, subdevices, DRM nodes."""
    card = card_of(node, user_bdf)
    path = node.function_path(card.user)
    index = list(_cards(node)).index(card.user)
    write_file(path / "user_pf", "")
    write_file(path / "ready", "0x1")
    write_file(path / "dev_offline", "0")
    write_file(path / "device_bad_state", "0")
    write_file(path / "logic_uuids", DEFAULT_LOGIC_UUID)
    write_file(path / "interface_uuids", DEFAULT_INTERFACE_UUID)
    write_file(path / "xclbinuuid", NO_XCLBIN)
    write_file(path / f"rom.u.{index}" / "VBNV", shell)
    write_file(path / f"rom.u.{index}" / "timestamp", timestamp)
    write_file(path / f"firewall.u.{FIREWALL_INSTANCE_BASE + index}" / "status", "0")
    write_file(path / "drm" / f"card{index}" / "dev", f"{DRM_MAJOR}:{index}")
    write_file(path / "drm" / card.render / "dev", card.dev)
    _driver(node, path, "xocl")
    restore_render_node(node, user_bdf)


def load_xclbin(node: FakeNode, user_bdf: str, uuid: str) -> None:
    """What xocl shows once an xclbin is loaded: its UUID in ``xclbinuuid``."""
    write_file(node.function_path(card_of(node, user_bdf).user) / "xclbinuuid", uuid)


def unbind_xocl(node: FakeNode, user_bdf: str) -> None:
    """The driver lets go: everything it created disappears, the PCI function stays."""
    card = card_of(node, user_bdf)
    path = node.function_path(card.user)
    for entry in list(path.iterdir()):
        if entry.name in ("vendor", "device", "class", "numa_node", "physfn"):
            continue
        if entry.is_symlink() or entry.is_file():
            entry.unlink()
        else:
            shutil.rmtree(entry)
    delete_render_node(node, user_bdf)


def set_state(node: FakeNode, user_bdf: str, name: str, value: str) -> None:
    """Write one of the user function's state files (``ready``, ``dev_offline``...) in place."""
    write_file(node.function_path(card_of(node, user_bdf).user) / name, value)


def trip_firewall(node: FakeNode, user_bdf: str, status: str = "0x1") -> Path:
    path = node.function_path(card_of(node, user_bdf).user)
    [firewall] = [p for p in path.iterdir() if p.name.startswith("firewall.")]
    write_file(firewall / "status", status)
    return firewall / "status"


def delete_render_node(node: FakeNode, user_bdf: str) -> None:
    card = card_of(node, user_bdf)
    (node.dev_root / "dri" / card.render).unlink(missing_ok=True)
    (node.dev_root / "char" / card.dev).unlink(missing_ok=True)


def restore_render_node(node: FakeNode, user_bdf: str) -> None:
    card = card_of(node, user_bdf)
    write_file(node.dev_root / "dri" / card.render, "")
    relative_link(node.dev_root / "char" / card.dev, node.dev_root / "dri" / card.render)


def remove_alveo_card(node: FakeNode, user_bdf: str) -> None:
    card = _cards(node).pop(str(pci_address(user_bdf)))
    delete_render_node(node, card.user)
    node.remove_function(card.user)
    node.remove_function(card.management)


def card_of(node: FakeNode, user_bdf: str) -> FakeAlveo:
    return _cards(node)[str(pci_address(user_bdf))]


def _driver(node: FakeNode, function: Path, name: str) -> None:
    driver = node.sysfs_root / "bus" / "pci" / "drivers" / name
    driver.mkdir(parents=True, exist_ok=True)
    relative_link(function / "driver", driver)


ALVEO_CARDS = tuple(f"0000:{0x17 + 0x10 * i:02x}:00.1" for i in range(8))


def build_alveo_node(root: Path, count: int = 8) -> FakeNode:
    """``count`` cards (at most 8), half on NUMA node 0, half on 1."""
    node = FakeNode(root)
    for index, bdf in enumerate(ALVEO_CARDS[:count]):
        add_alveo_card(node, bdf, numa_node=0 if index < count // 2 else 1)
    return node


def build_mixed_node(root: Path) -> FakeNode:
    """One node with every family ``--backend auto`` serves: two Intel ports (OPAE and DFL,
    one per NUMA node), an AWS F1 and an F2 slot, and two Alveo cards."""
    node = FakeNode(root)
    node.add_opae_card("0000:5e:00.0", numa_node=0)
    node.add_dfl_card("0000:d8:00.0", numa_node=1)
    node.add_slot("0000:00:0f.0", numa_node=0)
    node.add_f2_slot("0000:34:00.0", numa_node=1)
    add_alveo_card(node, "0000:17:00.1", numa_node=0)
    add_alveo_card(node, "0000:af:00.1", numa_node=1)
    return node
