"""Writing a fake sysfs or /dev tree: files as sysfs shows them, links as sysfs and udev make
them (relative, so a tree can be moved or copied), PCI addresses checked as they are named.

Shared by the fake trees of every family (:mod:`compat_tests.fake_sysfs`,
:mod:`compat_tests.fake_aws`, :mod:`compat_tests.fake_alveo`).
"""

from __future__ import annotations

import os
from pathlib import Path

from plugin.discovery.backends.pci import PciAddress, parse_bdf


def pci_address(bdf: str) -> PciAddress:
    address = parse_bdf(bdf)
    if address is None:
        raise ValueError(f"{bdf!r} is not a PCI address")
    return address


def write_file(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n" if text else "")


def relative_link(link: Path, target: Path) -> None:
    """A relative symlink, as sysfs and udev make them, so a tree can be moved or copied."""
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    os.symlink(os.path.relpath(target, link.parent), link)
