"""Watches the API server ends at once are made anew with back-off, not in a loop.

The client library makes a watch anew, from the last version it saw, whenever the server
ends one cleanly: right for a server ending a watch at its timeout after minutes, a loop of
requests as fast as the server answers when something (a proxy with a short timeout, an
overloaded server) ends every watch at once. client-go's reflector counts a watch that ends
within a second without an event as a failure and backs off; this transport does the same
for every watch the client makes, underneath the library: a watch request following such a
watch waits first (:data:`BACKOFF_INITIAL` doubling to :data:`BACKOFF_MAX`), and a watch that
delivers anything, or lasts, sets the pace back to none. The pace is kept per watched path
(one resource, as client-go keeps one back-off per reflector): the client also watches other
objects (DeviceClasses, its Node), and their watches ending must not hold back the slice
watch that puts back what a kubelet start wiped. The state change is logged once, as a
warning, when the first watch starts being cut short, and once, as information, when every
watch stays open again.

Why a transport: the library's watch loop has no hook, and a transport is httpx's extension
point for what happens around each request. It wraps the transport httpx would have made,
with the same TLS settings.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import httpx2

log = logging.getLogger(__name__)

SHORT_WATCH = 1.0
"""A watch that ends cleanly within this many seconds without an event was cut short."""
BACKOFF_INITIAL = 0.2
BACKOFF_MAX = 30.0

Ended = Callable[[float, bool, bool], None]
"""``(seconds it lasted, anything delivered, ended by the server)``."""


class WatchPacing(httpx2.AsyncBaseTransport):
    """Passes every request to ``inner``; holds back a watch after watches cut short."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, *,
                 backoff_initial: float = BACKOFF_INITIAL,
                 backoff_max: float = BACKOFF_MAX) -> None:
        self._inner = inner
        self._initial = backoff_initial
        self._max = backoff_max
        self._paces: dict[str, _Pace] = {}
        """Per watched path; a path whose watches stay open has no entry."""
        self._warned = False

    @property
    def cut_short(self) -> int:
        """Most watches of one path in a row that ended at once without an event."""
        return max((pace.cut_short for pace in self._paces.values()), default=0)

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if request.url.params.get("watch") not in ("true", "1"):
            return await self._inner.handle_async_request(request)
        path = request.url.path
        pace = self._paces.get(path)
        if pace is not None and pace.delay:
            await asyncio.sleep(pace.delay)
        response = await self._inner.handle_async_request(request)
        if response.status_code != 200:  # an error: the caller's back-off handles it
            return response
        response.stream = _Watched(
            response.stream, lambda *ended: self._ended(path, *ended))
        return response

    def _ended(self, path: str, lasted: float, delivered: bool, whole: bool) -> None:
        """A watch of ``path`` closed: by the server (``whole``) or by its reader."""
        if delivered or lasted >= SHORT_WATCH or not whole:
            pace = self._paces.pop(path, None)
            if self._warned and pace is not None and pace.cut_short > 1 and \
                    all(p.cut_short <= 1 for p in self._paces.values()):
                self._warned = False
                log.info("the API server keeps a watch open again, after ending %d at once",
                         pace.cut_short)
            return
        pace = self._paces.setdefault(path, _Pace())
        pace.cut_short += 1
        pace.delay = min(max(pace.delay * 2, self._initial), self._max)
        # One can be chance; two in a row is how the server behaves.
        if pace.cut_short >= 2 and not self._warned:
            self._warned = True
            log.warning("the API server ends watches at once (within %g s, without an "
                        "event); watching again with back-off, up to %g s apart, until it "
                        "keeps one open", SHORT_WATCH, self._max)

    async def aclose(self) -> None:
        await self._inner.aclose()


@dataclass
class _Pace:
    """One watched path's watches cut short in a row, and the pause before the next."""

    cut_short: int = 0
    delay: float = 0.0


class _Watched(httpx2.AsyncByteStream):
    """A watch's body, passed through; says when it closes, how long it lasted, and whether
    anything came."""

    def __init__(self, inner: httpx2.AsyncByteStream, ended: Ended) -> None:
        self._inner = inner
        self._ended = ended
        self._began = time.monotonic()
        self._delivered = False
        self._whole = False
        self._closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            if chunk:
                self._delivered = True
            yield chunk
        self._whole = True

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._ended(time.monotonic() - self._began, self._delivered, self._whole)
        await self._inner.aclose()
