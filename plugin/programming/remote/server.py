"""The loader process's side: a unix socket that answers one narrow request per connection.

Nothing a request says is trusted. The device is looked up in the loader's own discovery
(the same backends and flags as ``serve``; a device the driver names that is not on this
node is refused), the loader for its family is the loader's own choice (its flags), the
image must be inside its own library (containment checked here and again as the loader
opens it), the digest is checked over the bytes it loads, and the header must fit the
device, all before the card is touched.

Who may ask: the socket is created in a directory of mode 0700 and is itself 0600, both
owned by the allowed UID, and each connection's peer credentials (``SO_PEERCRED``, which
the kernel fills at ``connect``; unix(7)) must name an allowed UID, or the connection is
refused unread. A request is read for at most :data:`READ_TIMEOUT` seconds and
:data:`~.protocol.MAX_REQUEST` bytes; a bad one gets a clear refusal, and no request, good
or bad, ends the server. A load runs to its end even when the driver hangs up: a card is
never left half-programmed because a caller went away.

Loads for one card take turns (two ports of one FME share its partial-reconfiguration
engine). A load waiting its turn is still the client's: its ``timeout`` is the client's
budget and the wait counts in it, so the load starts with what is left (a load with too
little left, :data:`START_BUDGET`, is refused untouched, saying how long it waited and for
what), and a load whose client hung up while it waited is dropped, nothing loaded. The
client half-closes its side once its request is sent, which is not a hang-up; a full close
shows on the server's socket as ``POLLHUP`` (unix(7) stream sockets; :func:`hung_up`).

The server blocks: each connection is served by a thread of its own (requests are rare), and
the loaders' blocking cores run in it (``load_blocking``), so this process holds no event
loop and does not import asyncio, nor the ssl it pulls in: a few MiB of the privileged
process's memory. Stopping (:func:`serve_socket`'s ``stop``) closes the socket and waits
for the connections under way: a load under way is finished first.

With ``--require-image-digest`` the loader refuses, on its own, any image the request does
not pin with a ``sha256``: a driver that was made to ask for an unpinned file (through the
tenant input it parses) gets a refusal, not a load. A load by ID (an AWS AGFI: no image,
no bytes on this node to hash) is not an image and passes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

from plugin.programming.card_state import card_of
from plugin.programming.digest import DIGEST_STEP
from plugin.programming.library import ImageLibrary
from plugin.programming.loaders.base import LoadFailed, LoadJob, LocalLoader
from plugin.programming.loaders.checks import CHECK_STEP
from plugin.programming.remote import protocol
from plugin.programming.remote.protocol import REQUEST_STEP, BadRequest, Request
from value_types.devices import Device

log = logging.getLogger(__name__)

READ_TIMEOUT = 5.0
"""Seconds a connected peer has to send its whole request."""
DEVICE_STEP = "find device"
CARD_STEP = "wait for card"
"""The step a load refused or dropped while it waited for its card names."""
START_BUDGET = 1.0
"""Seconds of its budget a load needs left to start (or half its budget, if that is less):
one started with less would be killed half-way, leaving the card unknown."""
HANGUP_POLL = 0.1
"""Seconds between two looks at a waiting load's connection."""
STOP_POLL = 0.2
"""Seconds between two looks, while no one connects, at whether the server must stop."""
SEND_TIMEOUT = 30.0
"""Seconds a peer has to take its answer (it reads it at once: a driver that stopped
reading must not hold a connection thread, nor the server's stopping, for ever)."""


def never_gone() -> bool:
    return False


class LoaderService:
    """Answers requests (no socket here: :func:`serve_socket` carries them), each in the
    calling thread."""

    def __init__(self, scan: Callable[[], list[Device]], loaders: Mapping[str, LocalLoader],
                 library: ImageLibrary, *, require_digest: bool = False) -> None:
        self._scan = scan
        self.loaders = dict(loaders)
        self.library = library
        self.require_digest = require_digest
        self._locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()

    def answer(self, data: bytes, gone: Callable[[], bool] = never_gone) -> bytes:
        """The answer to the request ``data``; never raises. ``gone`` tells whether the
        client has hung up (a waiting load is then dropped)."""
        received = time.monotonic()
        try:
            request = protocol.parse_request(data)
        except BadRequest as exc:
            log.warning("refused a request: %s", exc)
            return protocol.refused(REQUEST_STEP, str(exc))
        except Exception:  # parse_request promises BadRequest only; a bug is still a refusal
            log.exception("refused a request that could not be read")
            return protocol.refused(REQUEST_STEP, "the request could not be read")
        try:
            if request.op == "inventory":
                return self._inventory()
            device = self._device(request)
            if request.op == "loaded":
                return self._loaded(device)
            return self._load(request, device, received + request.timeout, gone)
        except LoadFailed as failure:
            if request.op == "load":
                log.error("load onto %s refused or failed at %s: %s", request.device,
                          failure.step, failure.detail)
            return protocol.refused(failure.step, failure.detail, touched=failure.touched)
        except Exception as exc:  # a bug must not end the server, nor hide the card's state
            log.exception("%s request for %s failed", request.op, request.device)
            return protocol.refused(request.op, f"the loader failed: {exc!r}",
                                    touched=request.op == "load")

    def _devices(self) -> dict[str, Device]:
        return {d.id: d for d in self._scan()}

    def _device(self, request: Request) -> Device:
        device = self._devices().get(request.device or "")
        if device is None:
            raise LoadFailed(DEVICE_STEP, f"device {request.device} is not on this node (the "
                                          "loader's own discovery does not find it)",
                             touched=False)
        return device

    def _inventory(self) -> bytes:
        devices = self._devices()
        why = {d.id: self._unavailable(d) for d in devices.values()}
        return protocol.ok(devices=why, loaders={f: lo.name for f, lo in self.loaders.items()})

    def _unavailable(self, device: Device) -> str | None:
        loader = self.loaders.get(device.backend)
        if loader is None:
            return f"no loader programs {device.backend} devices"
        return loader.unavailable(device)

    def _loaded(self, device: Device) -> bytes:
        loader = self.loaders.get(device.backend)
        if loader is None:
            return protocol.ok(function=None)
        return protocol.ok(function=loader.loaded_blocking(device))

    def _card_lock(self, card: str) -> threading.Lock:
        with self._locks_lock:
            return self._locks.setdefault(card, threading.Lock())

    def _load(self, request: Request, device: Device, deadline: float,
              gone: Callable[[], bool]) -> bytes:
        loader = self.loaders.get(device.backend)
        why = self._unavailable(device)
        if loader is None or why is not None:
            raise LoadFailed(DEVICE_STEP, f"{device.id}: {why}", touched=False)
        if request.image is not None:
            if self.require_digest and request.sha256 is None:
                raise LoadFailed(DIGEST_STEP, f"{device.id}: image {request.image!r} is not "
                                              "pinned by sha256, and this loader loads only "
                                              "pinned images (--require-image-digest); "
                                              "nothing was loaded", touched=False)
            try:
                self.library.resolve(request.image)
            except ValueError as exc:
                raise LoadFailed(CHECK_STEP, f"{device.id}: {exc}", touched=False) from None
        card = card_of(device)
        lock = self._card_lock(card)
        started = time.monotonic()
        taken = _take(lock, deadline, gone)
        waited, left = time.monotonic() - started, deadline - time.monotonic()
        refusal = None
        if gone():  # logged as every refusal is, by answer()
            refusal = (f"{device.id}: the client hung up while the load waited {waited:.1f} s "
                       f"for card {card}; nothing was loaded")
        elif left < min(START_BUDGET, request.timeout / 2):
            refusal = (f"{device.id}: waited {waited:.1f} s for card {card} (another load "
                       f"onto it under way), and {max(left, 0):.1f} s of the load's "
                       f"{request.timeout:g} s timeout are left; nothing was loaded")
        if refusal is not None:
            if taken:
                lock.release()
            raise LoadFailed(CARD_STEP, refusal, touched=False)
        job = LoadJob(device, request.function_id or "",
                      self.library if request.image is not None else None, request.image,
                      timeout=left, sha256=request.sha256)
        log.info("loading %s (%s) onto %s with %s%s", request.function_id,
                 request.image or "by ID", device.id, loader.name,
                 f" after waiting {waited:.1f} s for card {card}" if waited >= 0.05 else "")
        # The load runs to its end in this thread whatever the client does, and stopping
        # the server waits for it: a card is never left half-programmed.
        try:
            loader.load_blocking(job)
        finally:
            lock.release()
        log.info("loaded %s onto %s", request.function_id, device.id)
        return protocol.ok(loader=loader.name)


def _take(lock: threading.Lock, deadline: float, gone: Callable[[], bool]) -> bool:
    """True once ``lock`` (a card) is held; False, not holding it, when the wait ended first:
    at ``deadline`` or once the client is ``gone``."""
    while not gone():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if lock.acquire(timeout=min(HANGUP_POLL, left)):
            return True
    return False


def hung_up(sock: socket.socket) -> bool:
    """Whether the peer closed its end of ``sock`` entirely: ``POLLHUP`` (or an error) on a
    unix stream socket. Its half-close after sending the request shows only as the end of
    input, which is not a hang-up."""
    poller = select.poll()
    try:
        poller.register(sock.fileno(), 0)  # no events asked: HUP, ERR and NVAL still come
    except (OSError, ValueError):
        return True
    return any(mask & (select.POLLHUP | select.POLLERR | select.POLLNVAL)
               for _fd, mask in poller.poll(0))


def peer_uid(sock: socket.socket) -> int:
    """The UID the kernel recorded for the peer at ``connect`` (``struct ucred``)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid


def prepare_socket_dir(path: Path, owner: int) -> None:
    """The socket's directory, 0700 and owned by ``owner``; a stale socket removed (only a
    socket: anything else at the path is an error, never deleted)."""
    directory = path.parent
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    if os.geteuid() == 0 and directory.stat().st_uid != owner:
        os.chown(directory, owner, -1)
    directory.chmod(0o700)
    try:
        info = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise OSError(f"{path} exists and is not a socket; refusing to replace it")
    path.unlink()


def serve_socket(path: Path, allowed: Collection[int], service: LoaderService,
                 stop: threading.Event) -> None:
    """Serve ``service`` on ``path`` until ``stop`` is set, then wait for the connections
    under way (a load is never cut off)."""
    owner = min(allowed)
    prepare_socket_dir(path, owner)
    handler = _Connections(allowed, service)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        old_mask = os.umask(0o177)  # the socket is created 0600, never briefly wider
        try:
            listener.bind(str(path))
        finally:
            os.umask(old_mask)
        listener.listen(16)
        path.chmod(0o600)
        if os.geteuid() == 0 and owner != 0:
            os.chown(path, owner, -1)
        log.info("loader listening on %s (peers with UID %s only)", path,
                 ", ".join(str(u) for u in sorted(allowed)))
        listener.settimeout(STOP_POLL)
        while not stop.is_set():
            try:
                conn, _address = listener.accept()
            except TimeoutError:
                continue
            handler.start(conn)
    finally:
        listener.close()
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    handler.finish()


class _Connections:
    def __init__(self, allowed: Collection[int], service: LoaderService) -> None:
        self.allowed = frozenset(allowed)
        self.service = service
        self._threads: set[threading.Thread] = set()
        self._guard = threading.Lock()

    def start(self, conn: socket.socket) -> None:
        thread = threading.Thread(target=self.handle, args=(conn,), name="loader connection")
        with self._guard:
            self._threads.add(thread)
        thread.start()

    def handle(self, conn: socket.socket) -> None:
        try:
            with conn:
                self._handle(conn)
                _linger(conn)
        except Exception:
            log.exception("a loader connection failed")
        finally:
            with self._guard:
                self._threads.discard(threading.current_thread())

    def _handle(self, conn: socket.socket) -> None:
        uid = peer_uid(conn)
        if uid not in self.allowed:
            log.warning("refused a connection from UID %d (allowed: %s)", uid,
                        ", ".join(str(u) for u in sorted(self.allowed)))
            _send(conn, protocol.refused(REQUEST_STEP, f"peer UID {uid} may not use the "
                                                       "loader"))
            return
        data = _read_request(conn, time.monotonic() + READ_TIMEOUT)
        if data is None:
            _send(conn, protocol.refused(REQUEST_STEP, f"no whole request within "
                                                       f"{READ_TIMEOUT:g} s"))
            return
        _send(conn, self.service.answer(data, lambda: hung_up(conn)))

    def finish(self) -> None:
        """Wait for the connections under way (a load is never cut off)."""
        while True:
            with self._guard:
                running = next(iter(self._threads), None)
            if running is None:
                return
            running.join()


def _read_request(conn: socket.socket, deadline: float) -> bytes | None:
    """Up to a newline or the end of input, and never more than one byte past the bound
    (so an oversized request is refused as such, unread beyond it); None when the peer
    has not sent that much by ``deadline``."""
    data = bytearray()
    while len(data) <= protocol.MAX_REQUEST:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        conn.settimeout(left)
        try:
            chunk = conn.recv(protocol.MAX_REQUEST + 1 - len(data))
        except TimeoutError:
            return None
        if not chunk:
            break
        data += chunk
        if b"\n" in chunk:
            break
    return bytes(data)


LINGER = 1.0
LINGER_BYTES = 1 << 20


def _linger(conn: socket.socket) -> None:
    """End the answer, then read what the peer still sends (bounded in time and bytes)
    before closing: a unix socket closed with input unread resets the connection, and
    the peer would lose the answer (a refusal sent before its request was read)."""
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + LINGER
        seen = 0
        while seen < LINGER_BYTES and (left := deadline - time.monotonic()) > 0:
            conn.settimeout(left)
            chunk = conn.recv(65536)
            if not chunk:
                return
            seen += len(chunk)


def _send(conn: socket.socket, answer: bytes) -> None:
    with contextlib.suppress(OSError):
        conn.settimeout(SEND_TIMEOUT)
        conn.sendall(answer)
