"""The driver's side: loaders that forward each load to the loader process.

With ``--loader-socket`` the driver's programmer is given these in place of the in-process
loaders (:func:`remote_loaders`): the same :class:`~plugin.programming.loaders.base.Loader`
promise, kept over the socket. Every way the loader can fail to answer gives a bounded
:class:`~plugin.programming.loaders.base.LoadFailed`, so a claim gets an error, never a
hang:

* no socket, a refused connection, no connection within :data:`CONNECT_TIMEOUT`: nothing
  was sent, so the card is untouched (``touched=False``);
* no answer within the load's own timeout plus :data:`ANSWER_GRACE` once the request was
  sent, or the connection lost meanwhile: the loader may be loading, so the card's state is
  unknown (``touched=True``: the programmer quarantines the device).

Which devices the loader can program (the ``programmable`` attribute the driver publishes)
comes from the loader's ``inventory``, read when the driver starts and every
:data:`INVENTORY_INTERVAL` seconds by a thread of its own; while the loader cannot be
reached, no device is programmable, and the reason says so. The published attribute
follows when the driver next republishes its devices.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from plugin.programming.loaders.base import Loader, LoadFailed, LoadJob
from plugin.programming.remote import protocol
from plugin.programming.remote.protocol import Request
from value_types.devices import Device

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 2.0
ANSWER_GRACE = 5.0
"""Seconds beyond a load's own timeout the loader has to answer (its tool is killed at the
timeout; killing and reaping it takes a moment)."""
QUERY_TIMEOUT = 30.0
"""Seconds an ``inventory`` or ``loaded`` answer may take (AWS's describe runs a tool)."""
INVENTORY_INTERVAL = 10.0
REACH_STEP = "reach loader"
ANSWER_STEP = "loader answer"
FAMILIES = ("intel", "alveo", "aws")


class LoaderClient:
    """One loader process at ``path``: requests over its socket, and its inventory."""

    def __init__(self, path: Path, interval: float = INVENTORY_INTERVAL) -> None:
        self.path = Path(path)
        self.interval = interval
        self._inventory: dict[str, str | None] = {}
        self._names: dict[str, str] = {}
        self._problem: str | None = "the loader's inventory has not been read yet"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.generation = 0
        """Counts changes of what the inventory says, so a cache of the published
        ``programmable`` attribute knows when it is stale."""
        self._watchers: list[Callable[[], None]] = []

    def watch(self, changed: Callable[[], None]) -> None:
        """Call ``changed`` (from the inventory thread: it must be thread-safe) whenever
        what the inventory says changes; once, however many families ask."""
        if changed not in self._watchers:
            self._watchers.append(changed)

    def _changed(self) -> None:
        self.generation += 1
        for changed in list(self._watchers):
            changed()

    # -- the inventory -------------------------------------------------------------------

    def start(self) -> None:
        """Read the inventory now (for at most a few seconds: the driver is starting), then
        keep it fresh from a thread of its own."""
        self.refresh(CONNECT_TIMEOUT)
        self._thread = threading.Thread(target=self._poll, name="loader inventory",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def refresh(self, timeout: float = QUERY_TIMEOUT) -> None:
        """Read the inventory once, blocking for at most ``timeout`` seconds."""
        try:
            answer = _blocking_call(self.path, Request("inventory"), timeout)
            devices, names = answer["devices"], answer["loaders"]
            if not isinstance(devices, dict) or not isinstance(names, dict):
                raise ValueError("inventory without devices or loaders")
        except (OSError, ValueError, KeyError, LoadFailed) as exc:
            problem = f"the loader process at {self.path} cannot be reached: {_said(exc)}"
            if problem != self._problem:
                log.warning("%s; no device is programmable until it answers", problem)
                self._problem = problem
                self._changed()
            return
        if self._problem is not None:
            log.info("the loader process at %s answers: %d device(s), %d programmable",
                     self.path, len(devices), sum(1 for v in devices.values() if v is None))
        inventory = {str(k): (None if v is None else str(v)) for k, v in devices.items()}
        found = {str(k): str(v) for k, v in names.items()}
        if (inventory, found, None) != (self._inventory, self._names, self._problem):
            self._inventory, self._names, self._problem = inventory, found, None
            self._changed()

    def _poll(self) -> None:
        while not self._stop.wait(self.interval):
            self.refresh()

    def unavailable(self, device: Device) -> str | None:
        if self._problem is not None:
            return self._problem
        if device.id not in self._inventory:
            return f"{device.id}: the loader process does not find this device"
        return self._inventory[device.id]

    def name(self, family: str) -> str:
        return self._names.get(family, "loader")

    # -- requests ------------------------------------------------------------------------

    async def call(self, request: Request, timeout: float) -> dict[str, Any]:
        """The loader's answer to ``request``; :class:`LoadFailed` when there is none
        (``touched`` as the module docstring says) or it refuses."""
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                reader, writer = await asyncio.open_unix_connection(str(self.path))
        except (OSError, TimeoutError) as exc:
            raise LoadFailed(REACH_STEP, f"the loader process at {self.path} cannot be "
                                         f"reached: {_said(exc)}; nothing was sent",
                             touched=False) from None
        try:
            unsent: OSError | None = None
            try:
                writer.write(request.encode())
                await writer.drain()
                writer.write_eof()
            except OSError as exc:
                unsent = exc  # a refusal (a peer UID not allowed) may still be there to read
            try:
                async with asyncio.timeout(timeout):
                    data = await _read_answer(reader)
            except (OSError, TimeoutError) as exc:
                if unsent is not None:
                    raise self._unsent(unsent) from None
                raise self._lost(request, f"no answer within {timeout:g} s"
                                 if isinstance(exc, TimeoutError) else _said(exc)) from None
            if not data and unsent is not None:
                raise self._unsent(unsent) from None
            try:
                answer = protocol.parse_answer(data)
            except (ValueError, UnicodeDecodeError) as exc:
                raise self._lost(request, f"no valid answer ({exc})") from None
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
        if not answer["ok"]:
            raise LoadFailed(answer["step"], answer["detail"], touched=answer["touched"])
        return answer

    def _unsent(self, exc: OSError) -> LoadFailed:
        return LoadFailed(REACH_STEP, f"the loader process at {self.path} took no request: "
                                      f"{_said(exc)}; nothing was loaded", touched=False)

    def _lost(self, request: Request, what: str) -> LoadFailed:
        if request.op == "load":
            return LoadFailed(ANSWER_STEP, f"the loader process at {self.path} gave {what} "
                                           f"to loading {request.function_id} onto "
                                           f"{request.device}; what the card holds now is "
                                           "unknown", touched=True)
        return LoadFailed(ANSWER_STEP, f"the loader process at {self.path} gave {what}",
                          touched=False)


class RemoteLoader:
    """The :class:`Loader` of one family, kept by the loader process."""

    def __init__(self, client: LoaderClient, family: str) -> None:
        self.client = client
        self.family = family

    @property
    def name(self) -> str:
        return self.client.name(self.family)

    @property
    def generation(self) -> int:
        return self.client.generation

    def watch(self, changed: Callable[[], None]) -> None:
        self.client.watch(changed)

    def unavailable(self, device: Device) -> str | None:
        if device.backend != self.family:
            return f"{device.id}: a {device.backend} device, not {self.family}"
        return self.client.unavailable(device)

    async def load(self, job: LoadJob) -> None:
        request = Request("load", device=job.device.id, function_id=job.function_id,
                          image=job.image, sha256=job.sha256,
                          timeout=min(max(job.timeout, 0.1), protocol.MAX_TIMEOUT))
        await self.client.call(request, request.timeout + ANSWER_GRACE)

    async def loaded(self, device: Device) -> str | None:
        answer = await self.client.call(Request("loaded", device=device.id), QUERY_TIMEOUT)
        function = answer.get("function")
        return function if isinstance(function, str) and function else None


def remote_loaders(path: Path, start: bool = True) -> Mapping[str, Loader]:
    """``{family: loader}`` forwarding to the loader process at ``path``."""
    client = LoaderClient(path)
    if start:
        client.start()
    return {family: RemoteLoader(client, family) for family in FAMILIES}


async def _read_answer(reader: asyncio.StreamReader) -> bytes:
    """To the end of the answer (its newline or the end of input), one byte past the
    bound at most."""
    data = bytearray()
    while len(data) <= protocol.MAX_ANSWER:
        chunk = await reader.read(protocol.MAX_ANSWER + 1 - len(data))
        if not chunk:
            break
        data += chunk
        if data.endswith(b"\n"):
            break
    return bytes(data)


def _blocking_call(path: Path, request: Request, timeout: float) -> dict[str, Any]:
    """:meth:`LoaderClient.call` without an event loop, for the inventory thread."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(CONNECT_TIMEOUT)
        sock.connect(str(path))
        sock.settimeout(timeout)
        sock.sendall(request.encode())
        sock.shutdown(socket.SHUT_WR)
        data = bytearray()
        while len(data) <= protocol.MAX_ANSWER:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    answer = protocol.parse_answer(bytes(data))
    if not answer["ok"]:
        raise LoadFailed(answer["step"], answer["detail"], touched=answer["touched"])
    return answer


def _said(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "it did not answer in time"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    if isinstance(exc, json.JSONDecodeError):
        return f"its answer is not JSON ({exc})"
    return str(exc) or type(exc).__name__
