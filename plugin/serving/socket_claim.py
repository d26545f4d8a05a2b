"""Taking a socket path in the kubelet's directory without ever taking it from a live server.

Two plugin processes can meet on one socket name: a DaemonSet rolling update that starts the
new pod before the old one ends (``maxSurge: 1``), or the plugin this one replaces left
running during a migration. Binding deletes whatever file is at the path, so two instances
that each "remove the stale socket and bind" delete each other's socket forever, and the
kubelet's device count flaps with every re-registration.

The rule here: a socket file that a process still accepts connections on is never removed. The
newcomer waits (see :class:`plugin.serving.deviceplugin.server.ResourceServer`) and takes the
path once the holder is gone: its socket deleted on a clean stop, or refusing connections after
a crash. Probing and binding happen under an exclusive ``flock`` on the directory itself (a file
of our own there would be deleted by a starting kubelet), so two instances of this plugin that
race for a freed path cannot both win; the socket is bound under a private name and renamed into
place (see :func:`staging_path`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import itertools
import os
import socket
import stat
import struct
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from plugin.serving.routing import FileIdentity, identity

LOCK_POLL_SECONDS = 0.01
PROBE_TIMEOUT_SECONDS = 0.5
_UCRED = struct.Struct("3i")


class PathState(Enum):
    ABSENT = "absent"
    STALE = "stale"
    """A socket file nobody listens on (its server was killed), or something not a socket."""
    LIVE = "live"


@dataclass(frozen=True)
class Probe:
    state: PathState
    holder_pid: int | None = None
    """The listening process as this process's PID namespace sees it (None if unknown)."""

    def describe(self) -> str:
        if self.holder_pid:
            return f"process {self.holder_pid}"
        return "a process outside this container"


class SocketHeld(Exception):
    """Our socket path is served by another live process."""

    def __init__(self, path: Path, probe: Probe) -> None:
        super().__init__(f"{path} is served by {probe.describe()}")
        self.path = path
        self.probe = probe


def probe(path: Path) -> Probe:
    """Whether ``path`` is free, stale or answered by a live listener (never raises)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return Probe(PathState.ABSENT)
    except OSError:
        return Probe(PathState.STALE)
    if not stat.S_ISSOCK(mode):
        return Probe(PathState.STALE)  # a directory there fails to unlink, and says why
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(PROBE_TIMEOUT_SECONDS)
        try:
            client.connect(str(path))
        except (ConnectionRefusedError, FileNotFoundError):
            return Probe(PathState.STALE)
        except OSError as exc:
            # A full backlog (EAGAIN) or a slow accept still means somebody is listening.
            if exc.errno in (errno.EAGAIN, errno.ETIMEDOUT) or isinstance(exc, TimeoutError):
                return Probe(PathState.LIVE)
            return Probe(PathState.STALE)
        return Probe(PathState.LIVE, _peer_pid(client))


def _peer_pid(client: socket.socket) -> int | None:
    try:
        pid, _uid, _gid = _UCRED.unpack(
            client.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    except OSError:
        return None
    return pid or None


@contextlib.asynccontextmanager
async def directory_lock(directory: Path) -> AsyncIterator[None]:
    """Hold an exclusive ``flock`` on ``directory`` (shared by every instance on the node).

    Held only for a probe and a bind, a few milliseconds, so polling without blocking the
    event loop costs nothing noticeable; a directory that cannot be opened is not locked.
    """
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        yield
        return
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                await asyncio.sleep(LOCK_POLL_SECONDS)
            except OSError:
                break  # a filesystem without flock: fall back to probing alone
        yield
    finally:
        os.close(fd)  # closing drops the lock


MAX_UNIX_PATH = 107
_binds = itertools.count()


def staging_path(final: Path) -> Path:
    """Where to bind before renaming the socket into place (``final`` if that is too long).

    gRPC removes the path it bound when its server stops. Bound at ``final``, stopping a
    server whose socket was meanwhile replaced (by a kubelet restart and another instance)
    would delete the other instance's live socket. Bound under a private name and renamed,
    the server's stop removes nothing, and ``final`` never goes missing during a bind.
    """
    staged = final.with_name(f".{os.getpid()}-{next(_binds)}.bind")
    return staged if len(str(staged.absolute())) <= MAX_UNIX_PATH else final


def move_into_place(staged: Path, final: Path) -> None:
    """Atomically put the bound socket at ``final`` (replacing a stale file there)."""
    if staged != final:
        os.rename(staged, final)


@dataclass(frozen=True)
class Bound:
    """A gRPC server put in place at a socket path by :func:`serve_in_place`."""

    server: grpc.aio.Server
    served: FileIdentity | None
    """The file put there: removed on the way out only while it is still this one."""
    replaced_stale: bool
    """A dead socket (nothing answered on it) was at the path and was replaced."""
    bound_at: str = ""
    """The path the listener was bound at (what ``/proc/net/unix`` shows for it)."""


async def serve_in_place(path: Path, handlers: Sequence[grpc.GenericRpcHandler],
                         health: health_aio.HealthServicer, *,
                         under_lock: Callable[[], None] = lambda: None) -> Bound:
    """Serve ``handlers`` (and the gRPC health service) at ``path`` the claim's way: under the
    directory's lock, never over a socket a live process answers on (:class:`SocketHeld`),
    bound under a private name and renamed into place. ``under_lock`` runs once the path is
    known free, before the bind (a check that must not race another instance)."""
    async with directory_lock(path.parent):
        found = probe(path)
        if found.state is PathState.LIVE:
            raise SocketHeld(path, found)
        under_lock()
        staged = staging_path(path)
        server = grpc.aio.server()
        server.add_generic_rpc_handlers(list(handlers))
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        server.add_insecure_port(f"unix://{staged.absolute()}")
        await server.start()
        try:
            move_into_place(staged, path)
        except BaseException:
            await server.stop(None)
            raise
        return Bound(server, identity(path), found.state is PathState.STALE,
                     str(staged.absolute()))
