"""The emulator's etcd and watch cache: objects, one revision counter, an event window, watchers.

Like a real server, every write of any kind takes the next value of one global counter as its
``resourceVersion``; a watch resumes from a revision by replaying the events after it, as long as
that revision is still inside the window the watch cache keeps; older ones answer 410 Gone
(``too old resource version: R (C)``, apiserver ``pkg/storage/cacher/watch_cache.go``). A watch
with a selector sees an object that stops matching as DELETED and one that starts matching as
ADDED (``cacher.go`` watchers). The store survives an emulated restart: an API server restart
keeps etcd.
"""

from __future__ import annotations

import asyncio
import copy
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]
Key = tuple[str, str, str]  # resource, namespace ("" if cluster-scoped), name
Predicate = Callable[[Obj], bool]


@dataclass(frozen=True)
class Event:
    type: str  # ADDED, MODIFIED, DELETED
    rv: int
    resource: str
    obj: Obj
    old: Obj | None = None


class TooOld(Exception):
    """A resourceVersion older than the window the store still has events for."""

    def __init__(self, requested: int, compacted: int) -> None:
        super().__init__(f"too old resource version: {requested} ({compacted})")


CLOSE = object()
"""Put on a watcher's queue to end its stream cleanly (what a server does at timeout)."""


@dataclass(eq=False)
class Watcher:
    resource: str
    namespace: str | None
    predicate: Predicate
    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)

    def translate(self, event: Event) -> tuple[str, Obj] | None:
        """The event this watcher sees, if any, after its namespace and selectors."""
        if event.resource != self.resource:
            return None
        namespace = event.obj.get("metadata", {}).get("namespace", "")
        if self.namespace is not None and namespace != self.namespace:
            return None
        now = event.type != "DELETED" and self.predicate(event.obj)
        before = event.old is not None and self.predicate(event.old)
        if event.type == "DELETED":
            return ("DELETED", event.obj) if self.predicate(event.obj) else None
        if now and before:
            return ("MODIFIED", event.obj)
        if now:
            return ("ADDED", event.obj)
        if before:
            return ("DELETED", event.obj)
        return None

    def offer(self, event: Event) -> None:
        seen = self.translate(event)
        if seen is not None:
            self.queue.put_nowait(seen)

    def close(self) -> None:
        self.queue.put_nowait(CLOSE)


class Store:
    """Objects by key, in stored (v1) form with metadata.resourceVersion set."""

    def __init__(self, window: int = 1000, first_revision: int = 1) -> None:
        self.revision = first_revision
        self.compacted = first_revision
        self.window = window
        self.objects: dict[Key, Obj] = {}
        self.history: deque[Event] = deque()
        self.watchers: set[Watcher] = set()

    @staticmethod
    def key(resource: str, namespace: str | None, name: str) -> Key:
        return (resource, namespace or "", name)

    def get(self, resource: str, namespace: str | None, name: str) -> Obj | None:
        found = self.objects.get(self.key(resource, namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def list(self, resource: str, namespace: str | None = None,
             predicate: Predicate | None = None) -> list[Obj]:
        """Matching objects sorted by namespace and name, as etcd returns them (by key)."""
        keys = sorted(k for k in self.objects if k[0] == resource
                      and (namespace is None or k[1] == namespace))
        items = [self.objects[k] for k in keys]
        return [copy.deepcopy(o) for o in items if predicate is None or predicate(o)]

    def names(self, resource: str) -> set[str]:
        return {k[2] for k in self.objects if k[0] == resource}

    def commit(self, resource: str, event_type: str, obj: Obj, old: Obj | None = None) -> Obj:
        """Write (or, for DELETED, remove) ``obj`` at the next revision; returns what is stored."""
        self.revision += 1
        stored = copy.deepcopy(obj)
        stored.setdefault("metadata", {})["resourceVersion"] = str(self.revision)
        meta = stored["metadata"]
        key = self.key(resource, meta.get("namespace"), meta["name"])
        if event_type == "DELETED":
            self.objects.pop(key, None)
        else:
            self.objects[key] = stored
        event = Event(event_type, self.revision, resource, copy.deepcopy(stored),
                      copy.deepcopy(old) if old is not None else None)
        self.history.append(event)
        while len(self.history) > self.window:
            self.compacted = self.history.popleft().rv
        for watcher in list(self.watchers):
            watcher.offer(event)
        return copy.deepcopy(stored)

    def events_since(self, revision: int) -> list[Event]:
        if revision < self.compacted:
            raise TooOld(revision, self.compacted)
        return [e for e in self.history if e.rv > revision]

    def compact(self, revision: int | None = None) -> None:
        """Forget events up to ``revision`` (default: all); resuming before it gets 410."""
        target = self.revision if revision is None else min(revision, self.revision)
        while self.history and self.history[0].rv <= target:
            self.history.popleft()
        self.compacted = max(self.compacted, target)

    def watch(self, resource: str, namespace: str | None, predicate: Predicate) -> Watcher:
        watcher = Watcher(resource, namespace, predicate)
        self.watchers.add(watcher)
        return watcher

    def unwatch(self, watcher: Watcher) -> None:
        self.watchers.discard(watcher)

    def close_watches(self) -> int:
        watchers = list(self.watchers)
        for watcher in watchers:
            watcher.close()
        self.watchers.clear()
        return len(watchers)
