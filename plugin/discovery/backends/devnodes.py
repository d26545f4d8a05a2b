"""From a sysfs ``dev`` attribute to the device node a container must get.

Resolution rule (the same for every backend):

1. ``dev`` holds ``MAJ:MIN``. If ``<dev-root>/char/MAJ:MIN`` exists (udev creates these links
   for every character device) and leads to a file inside ``<dev-root>``, that file is the
   node. This follows udev rules that rename or move nodes.
2. Otherwise ``<dev-root>/<kernel name>`` (``intel-fpga-port.0``, ``dfl-port.3``) is the node
   if it exists, so a ``/dev`` without the ``char/`` links still works.
3. Otherwise the node is missing and the device is Unhealthy until it appears.

The node only has to exist: on a real node it is a character device, in a fake tree built by
the source tree's ``compat_tests/fake_sysfs.py`` it is an empty regular file, because tests
and the demo cannot ``mknod``. Host and container paths are both ``/dev/<path under dev-root>``: the
dev-root is where the plugin looks (it may be the host's ``/dev`` mounted elsewhere), while the
container runtime resolves host paths on the host, where the node lives under ``/dev``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from plugin.discovery.backends.sysfs import Attr, exists, real_path
from value_types.devices import DeviceNode

_MAJ_MIN = re.compile(r"^(\d{1,10}):(\d{1,10})$")
CONTAINER_DEV = PurePosixPath("/dev")


@dataclass(frozen=True, slots=True)
class NodeLookup:
    """The node found for one device, or the reason there is none."""

    node: DeviceNode | None
    problem: str = ""
    warning: str = ""


def parse_dev(text: str) -> tuple[int, int] | None:
    match = _MAJ_MIN.match(text.strip())
    if match is None:
        return None
    return int(match[1]), int(match[2])


class NodeResolver:
    """Resolves nodes under one dev-root; make one per scan (it remembers the root's real path)."""

    def __init__(self, dev_root: Path) -> None:
        self.dev_root = dev_root
        self._real_root = real_path(dev_root)

    def resolve(self, dev: Attr, name: str, directory: str = "") -> NodeLookup:
        """Find the node of the character device ``name`` whose ``dev`` attribute is ``dev``.

        ``directory`` is where udev puts such nodes below the dev-root when not at its top
        (``dri`` for DRM render nodes); it only matters when there is no ``char/`` link.
        """
        warning = ""
        numbers = parse_dev(dev.text) if dev.text is not None else None
        if dev.text is not None and numbers is None:
            warning = f"{dev.path}: {dev.text[:40]!r} is not MAJ:MIN; looking for {name} by name"
        elif not dev.ok and not dev.missing:
            warning = f"{dev.describe()}; looking for {name} by name"
        if numbers is not None:
            relative = self._via_char_link(numbers)
            if relative is not None:
                return NodeLookup(_node(relative), warning=warning)
        relative = PurePosixPath(directory, name) if directory else PurePosixPath(name)
        by_name = self.dev_root / relative
        if "/" not in name and ".." not in relative.parts and exists(by_name):
            return NodeLookup(_node(relative), warning=warning)
        where = f"{by_name}"
        if numbers is not None:
            where += f" (and no {self.dev_root / 'char' / f'{numbers[0]}:{numbers[1]}'})"
        return NodeLookup(None, problem=f"device node {where} missing", warning=warning)

    def _via_char_link(self, numbers: tuple[int, int]) -> PurePosixPath | None:
        """The node a ``char/MAJ:MIN`` link names, as a path under the dev-root.

        udev writes these links relative (``../intel-fpga-port.0``), so they are resolved
        by name, which costs one readlink and one stat; an absolute link is resolved in
        full. Either way the node must exist and lie inside the dev-root.
        """
        link = self.dev_root / "char" / f"{numbers[0]}:{numbers[1]}"
        try:
            target = os.readlink(link)
        except (OSError, ValueError):
            return None
        if os.path.isabs(target):
            resolved = real_path(link)
            if resolved is None or self._real_root is None:
                return None
            relative = os.path.relpath(resolved, self._real_root)
        else:
            candidate = os.path.normpath(os.path.join(link.parent, target))
            if not exists(Path(candidate)):
                return None
            relative = os.path.relpath(candidate, self.dev_root)
        parts = PurePosixPath(relative).parts
        if not parts or parts[0] in ("..", ".", "char"):
            return None
        return PurePosixPath(*parts)


def resolve_node(dev_root: Path, dev: Attr, name: str) -> NodeLookup:
    """One-off :meth:`NodeResolver.resolve`."""
    return NodeResolver(dev_root).resolve(dev, name)


def _node(relative: PurePosixPath) -> DeviceNode:
    path = str(CONTAINER_DEV / relative)
    return DeviceNode(host_path=path, container_path=path, permissions="rw")
