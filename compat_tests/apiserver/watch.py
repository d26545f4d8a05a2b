"""Watch streams: chunked, newline-delimited JSON events, as the apiserver writes them.

Each line is ``{"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, "object": {...}}`` with the object
in the requested version. Starting points follow the API concepts page: no ``resourceVersion``
or ``"0"`` sends the current objects as synthetic ADDED events first; a given revision replays
what came after it, or (when the window no longer reaches back) answers 200 and then one ERROR
event whose object is a 410 ``Expired`` Status; ``sendInitialEvents=true`` ends the initial
events with a BOOKMARK annotated ``k8s.io/initial-events-end``. ``allowWatchBookmarks=true`` adds a
BOOKMARK every ``bookmark_interval`` seconds; ``timeoutSeconds`` ends the stream cleanly, as do the
emulator's ``end_watches()`` and ``timeout``, and, with the fault ``end_watches_at_once``, the
end of the backlog; an outage cuts it without an end.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any

from aiohttp import web

from compat_tests.apiserver import errors, schema, selectors
from compat_tests.apiserver.store import CLOSE, TooOld, Watcher

if TYPE_CHECKING:
    from compat_tests.apiserver.faults import LoggedRequest
    from compat_tests.apiserver.http_api import Backend, Target

_WAIT_FOR_REVISION = 3.0


def _bookmark(backend: Backend, target: Target, revision: int,
              initial_end: bool = False) -> dict[str, Any]:
    info = target.info
    meta: dict[str, Any] = {"resourceVersion": str(revision), "creationTimestamp": None}
    if initial_end:
        meta["annotations"] = {"k8s.io/initial-events-end": "true"}
    if info.group:
        obj = schema.encode({"metadata": {}}, info.name, target.version)
        obj["metadata"] = meta
        api_version = f"{info.group}/{target.version}"
    else:
        obj, api_version = {"metadata": meta}, "v1"
    return {"kind": info.kind, "apiVersion": api_version, **obj}


async def _start_revision(backend: Backend, requested: str) -> int | None:
    """The revision to replay from; None for "send current state first"."""
    if requested in ("", "0"):
        return None
    if not requested.isdigit():
        raise errors.bad_request(f'invalid resource version "{requested}"')
    revision = int(requested)
    deadline = time.monotonic() + _WAIT_FOR_REVISION
    while revision > backend.store.revision and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if revision > backend.store.revision:
        raise errors.too_large_resource_version(revision, backend.store.revision)
    return revision


async def serve_watch(backend: Backend, request: web.Request, target: Target,
                      entry: LoggedRequest) -> web.StreamResponse:
    query = request.query
    match = selectors.predicate(target.info, target.version, query)
    if target.name:
        name = target.name
        base = match
        match = lambda obj: base(obj) and obj.get("metadata", {}).get("name") == name  # noqa: E731
    start = await _start_revision(backend, query.get("resourceVersion", ""))
    bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
    initial_end = query.get("sendInitialEvents") == "true" and bookmarks
    timeout = float(query["timeoutSeconds"]) if query.get("timeoutSeconds") else None
    store = backend.store
    backlog: list[tuple[str, dict[str, Any]]] = []
    expired: TooOld | None = None
    watcher: Watcher | None = None
    # No await between reading the backlog and registering: no event can fall in between.
    try:
        if start is None or initial_end:
            backlog = [("ADDED", o) for o in store.list(target.info.name, target.namespace, match)]
        else:
            for event in store.events_since(start):
                seen = Watcher(target.info.name, target.namespace, match).translate(event)
                if seen is not None:
                    backlog.append(seen)
        watcher = store.watch(target.info.name, target.namespace, match)
    except TooOld as err:
        expired = err
    revision_at_start = store.revision
    response = web.StreamResponse(status=200, headers={"Content-Type": "application/json",
                                                       "Cache-Control": "no-cache, private"})
    response.enable_chunked_encoding()
    entry.status = 200
    await response.prepare(request)
    try:
        if expired is not None:
            await _send(response, "ERROR", errors.expired(str(expired)).status)
            return response
        for event_type, obj in backlog:
            await _send(response, event_type, _read(backend, target, obj))
        if initial_end:
            await _send(response, "BOOKMARK", _bookmark(backend, target, revision_at_start, True))
        if backend.faults.end_watches_at_once:
            return response
        assert watcher is not None
        await _pump(backend, target, watcher, response, bookmarks, timeout)
    finally:
        if watcher is not None:
            store.unwatch(watcher)
    return response


def _read(backend: Backend, target: Target, obj: dict[str, Any]) -> dict[str, Any]:
    if not target.info.group:
        return obj
    return backend.registry.read(target.info.name, target.version, obj)


async def _send(response: web.StreamResponse, event_type: str, obj: dict[str, Any]) -> None:
    line = json.dumps({"type": event_type, "object": obj}, separators=(",", ":")) + "\n"
    await response.write(line.encode())


async def _pump(backend: Backend, target: Target, watcher: Watcher,
                response: web.StreamResponse, bookmarks: bool, timeout: float | None) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout if timeout is not None else None
    next_bookmark = loop.time() + backend.bookmark_interval
    while True:
        waits = [next_bookmark - loop.time()] if bookmarks else []
        if deadline is not None:
            waits.append(deadline - loop.time())
        wait = max(0.0, min(waits)) if waits else None
        try:
            item = await asyncio.wait_for(watcher.queue.get(), wait)
        except TimeoutError:
            if deadline is not None and loop.time() >= deadline:
                return
            next_bookmark = loop.time() + backend.bookmark_interval
            await _send(response, "BOOKMARK", _bookmark(backend, target, backend.store.revision))
            continue
        if item is CLOSE:
            return
        event_type, obj = item
        await _send(response, event_type, _read(backend, target, obj))
