"""Kernel uevents (NETLINK_KOBJECT_UEVENT) as an asyncio source of rescan reasons.

sysfs gives no inotify events when a PCI function or an FPGA port comes or goes, but the
kernel broadcasts a uevent for each; listening to them is what lets a hot-plugged card
reach the kubelet within a second without polling. Where the socket cannot be opened
(unprivileged, some containers) or the network namespace receives no events, the periodic
rescan still finds every change, only later; so failing to listen is a warning, not an error.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import AsyncIterator, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from plugin.discovery.monitor import LISTENING

log = logging.getLogger(__name__)

NETLINK_KOBJECT_UEVENT = 15
KERNEL_GROUP = 1
"""Multicast group of events sent by the kernel itself (udev re-broadcasts on group 2)."""
RECEIVE_BUFFER = 1 << 20
MAX_DATAGRAM = 1 << 16
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)
OVERFLOW = "overflow: some uevents were lost"


@dataclass(frozen=True, slots=True)
class UEvent:
    action: str
    devpath: str
    subsystem: str
    properties: Mapping[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        """``add pci 0000:5e:00.0``: the action, the subsystem and the device's kernel name."""
        return f"{self.action} {self.subsystem} {self.devpath.rstrip('/').rsplit('/', 1)[-1]}"


def parse_uevent(datagram: bytes) -> UEvent | None:
    """Decode one kernel uevent datagram; None for udev's re-broadcasts and for garbage.

    The kernel sends ``ACTION@DEVPATH`` then ``KEY=VALUE`` fields, all NUL-terminated.
    """
    if datagram.startswith(b"libudev\0"):
        return None
    fields = datagram.decode("utf-8", errors="replace").split("\0")
    header = fields[0]
    if "@" not in header:
        return None
    properties = dict(f.split("=", 1) for f in fields[1:] if "=" in f)
    head_action, _, head_path = header.partition("@")
    action = properties.get("ACTION", head_action)
    devpath = properties.get("DEVPATH", head_path)
    subsystem = properties.get("SUBSYSTEM", "")
    if not action or not devpath or not subsystem:
        return None
    return UEvent(action, devpath, subsystem, properties)


async def kernel_uevents(subsystems: Collection[str]) -> AsyncIterator[str]:
    """Yield :data:`~plugin.discovery.monitor.LISTENING` once the socket is bound, then a
    description of each kernel uevent of ``subsystems``, until closed or cancelled.

    If the netlink socket cannot be opened (a seccomp profile, a kernel without it) this
    warns once and then stays silent without ending: that is a state of the node, and a
    source that ended would be restarted, and warned about, every half minute for ever. The
    monitor, never told LISTENING, rescans at its short interval instead. An empty
    ``subsystems`` listens to nothing and returns at once.
    """
    if not subsystems:
        return
    sock = open_uevent_socket()
    if sock is None:
        await asyncio.Event().wait()
        return
    try:
        if kernel_sends_uevents_here():
            yield LISTENING
        else:
            log.warning("this process runs in a user namespace of its own, and the kernel "
                        "sends device uevents only to network namespaces of the initial one, "
                        "so they cannot be relied on; hot-plug is seen by the periodic rescan")
        async for description in events_from(sock, subsystems, from_kernel_only=True):
            yield description
    finally:
        sock.close()


def kernel_sends_uevents_here(uid_map: Path = Path("/proc/self/uid_map")) -> bool:
    """Whether device uevents reach this process's network namespace, as far as it can tell.

    The kernel broadcasts them only into network namespaces owned by the initial user
    namespace (lib/kobject_uevent.c, since Linux 4.18). A socket in any other namespace
    binds without error and then hears nothing, so silence would be mistaken for a quiet
    node. A process in the initial user namespace sees the identity map over every ID; a pod
    with ``hostUsers: false`` sees a partial one. When that cannot be read, assume not: the
    cost is rescans at the short interval, never a missed device.
    """
    try:
        return uid_map.read_text().split() == ["0", "0", "4294967295"]
    except (OSError, UnicodeDecodeError):
        return False


def open_uevent_socket() -> socket.socket | None:
    """A non-blocking socket bound to the kernel's uevent group, or None with a warning."""
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC,
                             NETLINK_KOBJECT_UEVENT)
    except (OSError, AttributeError, ValueError) as exc:
        log.warning("cannot open the kernel uevent socket (%s); hot-plug is seen by the "
                    "periodic rescan only", exc)
        return None
    try:
        _grow_buffer(sock)
        sock.bind((0, KERNEL_GROUP))
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        log.warning("cannot listen to kernel uevents (%s); hot-plug is seen by the periodic "
                    "rescan only", exc)
        return None
    return sock


async def events_from(
    sock: socket.socket, subsystems: Collection[str], *, from_kernel_only: bool = False
) -> AsyncIterator[str]:
    """Descriptions of the wanted events read from ``sock`` (any datagram socket, for tests).

    With ``from_kernel_only``, datagrams not sent by the kernel (netlink port 0) are
    dropped: any local process may send to the group, and must not be able to make the
    plugin rescan in a loop. A receive-buffer overflow is reported as one event of its own,
    since a lost event may have been a device arriving.
    """
    wanted = frozenset(subsystems)
    loop = asyncio.get_running_loop()
    sock.setblocking(False)
    while True:
        try:
            datagram, sender = await loop.sock_recvfrom(sock, MAX_DATAGRAM)
        except OSError as exc:
            if exc.errno == errno.ENOBUFS:
                yield OVERFLOW
                continue
            log.warning("kernel uevent socket failed (%s); hot-plug is seen by the periodic "
                        "rescan only", exc)
            return
        if from_kernel_only and _sender_port(sender) != 0:
            continue
        event = parse_uevent(datagram)
        if event is not None and event.subsystem in wanted:
            yield event.describe()


def _sender_port(sender: object) -> int | None:
    if isinstance(sender, tuple) and sender and isinstance(sender[0], int):
        return sender[0]
    return None


def _grow_buffer(sock: socket.socket) -> None:
    """A large buffer, so a burst (a card with many VFs appearing) is not dropped."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RECEIVE_BUFFER)
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
