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

With ``--require-image-digest`` the loader refuses, on its own, any image the request does
not pin with a ``sha256``: a driver that was made to ask for an unpinned file (through the
tenant input it parses) gets a refusal, not a load. A load by ID (an AWS AGFI: no image,
no bytes on this node to hash) is not an image and passes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import socket
import stat
import struct
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

from plugin.programming.digest import DIGEST_STEP
from plugin.programming.library import ImageLibrary
from plugin.programming.loaders.base import Loader, LoadFailed, LoadJob
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


def never_gone() -> bool:
    return False


class LoaderService:
    """Answers requests (no socket here: :func:`serve_socket` carries them)."""

    def __init__(self, scan: Callable[[], list[Device]], loaders: Mapping[str, Loader],
                 library: ImageLibrary, *, require_digest: bool = False) -> None:
        self._scan = scan
        self.loaders = dict(loaders)
        self.library = library
        self.require_digest = require_digest
        self._locks: dict[str, asyncio.Lock] = {}

    async def answer(self, data: bytes, gone: Callable[[], bool] = never_gone) -> bytes:
        """The answer to the request ``data``; never raises. ``gone`` tells whether the
        client has hung up (a waiting load is then dropped)."""
        received = asyncio.get_running_loop().time()
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
                return await self._inventory()
            device = await self._device(request)
            if request.op == "loaded":
                return await self._loaded(device)
            return await self._load(request, device, received + request.timeout, gone)
        except LoadFailed as failure:
            if request.op == "load":
                log.error("load onto %s refused or failed at %s: %s", request.device,
                          failure.step, failure.detail)
            return protocol.refused(failure.step, failure.detail, touched=failure.touched)
        except Exception as exc:  # a bug must not end the server, nor hide the card's state
            log.exception("%s request for %s failed", request.op, request.device)
            return protocol.refused(request.op, f"the loader failed: {exc!r}",
                                    touched=request.op == "load")

    async def _devices(self) -> dict[str, Device]:
        return {d.id: d for d in await asyncio.to_thread(self._scan)}

    async def _device(self, request: Request) -> Device:
        devices = await self._devices()
        device = devices.get(request.device or "")
        if device is None:
            raise LoadFailed(DEVICE_STEP, f"device {request.device} is not on this node (the "
                                          "loader's own discovery does not find it)",
                             touched=False)
        return device

    async def _inventory(self) -> bytes:
        devices = await self._devices()
        why = {d.id: self._unavailable(d) for d in devices.values()}
        return protocol.ok(devices=why, loaders={f: lo.name for f, lo in self.loaders.items()})

    def _unavailable(self, device: Device) -> str | None:
        loader = self.loaders.get(device.backend)
        if loader is None:
            return f"no loader programs {device.backend} devices"
        return loader.unavailable(device)

    async def _loaded(self, device: Device) -> bytes:
        loader = self.loaders.get(device.backend)
        if loader is None:
            return protocol.ok(function=None)
        return protocol.ok(function=await loader.loaded(device))

    async def _load(self, request: Request, device: Device, deadline: float,
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
        card = device.attribute("fme_node") or device.attribute("pci_address") or device.id
        lock = self._locks.setdefault(card, asyncio.Lock())
        loop = asyncio.get_running_loop()
        started = loop.time()
        taken = await _take(lock, deadline, gone)
        waited, left = loop.time() - started, deadline - loop.time()
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
        # The card is released when the load ends, and the load is never cut off half-way
        # (shielded), even if this server is stopping.
        load = asyncio.ensure_future(loader.load(job))
        load.add_done_callback(lambda _: lock.release())
        await asyncio.shield(load)
        log.info("loaded %s onto %s", request.function_id, device.id)
        return protocol.ok(loader=loader.name)


async def _take(lock: asyncio.Lock, deadline: float, gone: Callable[[], bool]) -> bool:
    """True once ``lock`` (a card) is held; False, not holding it, when the wait ended first:
    at ``deadline`` or once the client is ``gone``."""
    loop = asyncio.get_running_loop()
    taking = asyncio.ensure_future(lock.acquire())
    try:
        while not taking.done() and loop.time() < deadline and not gone():
            await asyncio.wait({taking}, timeout=min(HANGUP_POLL, deadline - loop.time()))
    except BaseException:
        if taking.done() and not taking.cancelled():
            lock.release()
        else:
            taking.cancel()
        raise
    if taking.done():
        return True
    taking.cancel()  # Lock.acquire, cancelled, leaves the lock to the next waiter
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


async def serve_socket(path: Path, allowed: Collection[int], service: LoaderService,
                       stop: asyncio.Event) -> None:
    """Serve ``service`` on ``path`` until ``stop`` is set."""
    owner = min(allowed)
    prepare_socket_dir(path, owner)
    handler = _Connections(allowed, service)
    old_mask = os.umask(0o177)  # the socket is created 0600, never briefly wider
    try:
        server = await asyncio.start_unix_server(handler.handle, path=str(path))
    finally:
        os.umask(old_mask)
    path.chmod(0o600)
    if os.geteuid() == 0 and owner != 0:
        os.chown(path, owner, -1)
    log.info("loader listening on %s (peers with UID %s only)", path,
             ", ".join(str(u) for u in sorted(allowed)))
    async with server:
        await stop.wait()
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    await handler.finish()


class _Connections:
    def __init__(self, allowed: Collection[int], service: LoaderService) -> None:
        self.allowed = frozenset(allowed)
        self.service = service
        self._tasks: set[asyncio.Task[None]] = set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await self._handle(reader, writer)
            await _linger(reader, writer)
        except Exception:
            log.exception("a loader connection failed")
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            if task is not None:
                self._tasks.discard(task)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        uid = peer_uid(sock)
        if uid not in self.allowed:
            log.warning("refused a connection from UID %d (allowed: %s)", uid,
                        ", ".join(str(u) for u in sorted(self.allowed)))
            await _send(writer, protocol.refused(REQUEST_STEP, f"peer UID {uid} may not use "
                                                               "the loader"))
            return
        try:
            data = await asyncio.wait_for(_read_request(reader), READ_TIMEOUT)
        except TimeoutError:
            await _send(writer, protocol.refused(REQUEST_STEP, f"no whole request within "
                                                               f"{READ_TIMEOUT:g} s"))
            return
        await _send(writer, await self.service.answer(data, lambda: hung_up(sock)))

    async def finish(self) -> None:
        """Wait for the connections under way (a load is never cut off)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    """Up to a newline or the end of input, and never more than one byte past the bound
    (so an oversized request is refused as such, unread beyond it)."""
    data = bytearray()
    while len(data) <= protocol.MAX_REQUEST:
        chunk = await reader.read(protocol.MAX_REQUEST + 1 - len(data))
        if not chunk:
            break
        data += chunk
        if b"\n" in chunk:
            break
    return bytes(data)


LINGER = 1.0
LINGER_BYTES = 1 << 20


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """End the answer, then read what the peer still sends (bounded in time and bytes)
    before closing: a unix socket closed with input unread resets the connection, and
    the peer would lose the answer (a refusal sent before its request was read)."""
    with contextlib.suppress(Exception):
        writer.write_eof()
        async with asyncio.timeout(LINGER):
            seen = 0
            while seen < LINGER_BYTES and (chunk := await reader.read(65536)):
                seen += len(chunk)


async def _send(writer: asyncio.StreamWriter, answer: bytes) -> None:
    with contextlib.suppress(ConnectionError):
        writer.write(answer)
        await writer.drain()
