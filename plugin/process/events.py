"""Kubernetes Events (events.k8s.io/v1) about one object, aggregated, rate-limited, never blocking.

An Event is a convenience for an operator (``kubectl describe node``): writing one must never
hold up serving, and a cluster of flapping devices must not flood the API server. So, as
client-go's recorders do (``tools/events/event_broadcaster.go`` for the events.k8s.io API,
``tools/record/events_cache.go`` for its correlator), and with their numbers:

* **series**: the same event again (same type, reason, action, note) within
  :data:`SERIES_FINISH` of the last one is not a new object: the first Event gets a
  ``series`` (count, lastObservedTime) patched onto it. client-go's events.k8s.io key leaves
  the note out, which would fold a second device's Unhealthy into the first one's Event and
  lose its ID; the note is in the key here, as the message is in ``tools/record``'s;
* **similar events**: more than :data:`AGGREGATE_MAX` different notes of one type and reason
  within :data:`AGGREGATE_INTERVAL` become one series, noted ``(combined from similar events):
  <latest note>`` (``tools/record``'s aggregator), so many devices flapping cost one object;
* **spam filter**: a token bucket per source and object, :data:`SPAM_BURST` events then one
  every :data:`SPAM_REFILL` seconds (``tools/record``'s defaults); an occurrence it refuses is
  still counted, and the next one let through carries the count;
* **never blocking**: :meth:`EventRecorder.record` only correlates and appends to a bounded
  queue (:data:`QUEUE_LIMIT`, client-go's ``maxQueuedEvents``; beyond it new writes are
  dropped, as its ``DropIfChannelFull``); one task sends them. A server that is down or slow
  is retried with back-off, at most :data:`MAX_TRIES` times per write (client-go's
  ``maxTriesPerEvent``), a refusal (403, 422) drops that write; either is logged once per
  kind of failure until a write succeeds again.

Every cache is bounded (:data:`CACHE_LIMIT` entries, least recently used first out), so a
long-running process holds a few hundred KiB at most whatever happens. The API calls
themselves are behind :class:`EventSink` (plugin/serving/events_api.py for the real server),
so nothing here knows the client library.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

log = logging.getLogger(__name__)

SPAM_BURST = 25
SPAM_REFILL = 300.0
"""Seconds per token: client-go's ``defaultSpamQPS`` of 1/300."""
AGGREGATE_MAX = 10
AGGREGATE_INTERVAL = 600.0
SERIES_FINISH = 360.0
"""client-go's ``finishTime`` (6 minutes): an event not seen for this long ends its series,
and the next occurrence is a new Event."""
FINISH_EVERY = 60.0
"""How often the sender looks for series to finish."""
UID_RETRY = 60.0
"""Seconds between two reads of the regarding object's UID while it cannot be read."""
CACHE_LIMIT = 4096
QUEUE_LIMIT = 1000
MAX_TRIES = 12
RETRY_INITIAL = 0.2
RETRY_MAX = 30.0
NOTE_LIMIT = 1024
"""Bytes the API server accepts in a note (``NoteLengthLimit``)."""
SHORT_LIMIT = 128
"""Characters the API server accepts in an action, a reason or a reporting instance."""
NAMESPACE = "default"
"""Where client-go puts the Events of a cluster-scoped object, such as a Node."""

Clock = Callable[[], float]

NORMAL = "Normal"
WARNING = "Warning"


@dataclass(frozen=True)
class Regarding:
    """The object the Events are about (``regarding``): the recorder's own, cluster-scoped
    (a Node), or one an occurrence names (a ResourceClaim: namespaced, with its UID)."""

    kind: str
    name: str
    api_version: str = "v1"
    namespace: str = ""
    uid: str = ""


@dataclass(frozen=True)
class Occurrence:
    """Something that happened to the object, as the code that saw it says it;
    ``regarding``, when given, is the object it is about instead of the recorder's own."""

    type: str
    reason: str
    action: str
    note: str
    regarding: Regarding | None = None


class SinkFailure(Exception):
    """A write the sink could not make. ``kind`` groups failures for logging ("HTTP 403",
    "timeout"); ``retry``: worth trying again later; ``not_found``: the Event is gone."""

    def __init__(self, message: str, kind: str, retry: bool, not_found: bool = False) -> None:
        super().__init__(message)
        self.kind = kind
        self.retry = retry
        self.not_found = not_found


class EventSink(Protocol):
    """The API calls the recorder makes; each raises :class:`SinkFailure`."""

    async def uid(self) -> str | None:
        """The regarding object's UID (None when it cannot be read now)."""

    async def create(self, namespace: str, event: dict[str, Any]) -> None: ...

    async def patch(self, namespace: str, name: str, patch: dict[str, Any]) -> None: ...

    async def close(self) -> None: ...


class TokenBucket:
    """``burst`` tokens, refilled at one per ``refill`` seconds (flowcontrol's token bucket)."""

    def __init__(self, burst: int, refill: float, now: float) -> None:
        self.burst = burst
        self.refill = refill
        self.tokens = float(burst)
        self.at = now

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.at) / self.refill)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


class _Lru(OrderedDict[Any, Any]):
    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def touch(self, key: Any, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.limit:
            self.popitem(last=False)

    def find(self, key: Any) -> Any:
        found = self.get(key)
        if found is not None:
            self.move_to_end(key)
        return found


@dataclass
class _Series:
    name: str
    event: dict[str, Any]
    count: int = 1
    last: float = 0.0
    reported: int = 1
    """The count of the last write made for it (the spam filter may have held later ones)."""


@dataclass
class _Similar:
    notes: set[str] = field(default_factory=set)
    last: float = 0.0


@dataclass(frozen=True)
class Write:
    """One API call to make: a new Event, or a series update of one made before (which
    falls back to creating it when the server no longer has it)."""

    event: dict[str, Any]
    series: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return str(self.event["metadata"]["name"])


class Correlator:
    """Occurrences in, writes out: series, similar-event aggregation and the spam filter."""

    def __init__(self, regarding: Regarding, controller: str, instance: str,
                 clock: Clock = time.time) -> None:
        self.regarding = regarding
        self.controller = controller
        self.instance = instance[:SHORT_LIMIT]
        self.clock = clock
        self._series: _Lru = _Lru(CACHE_LIMIT)
        self._similar: _Lru = _Lru(CACHE_LIMIT)
        self._buckets: _Lru = _Lru(CACHE_LIMIT)
        self._last_stamp = 0
        self.filtered = 0
        """Occurrences the spam filter held back (counted in their series all the same)."""

    def correlate(self, occurrence: Occurrence) -> Write | None:
        now = self.clock()
        occurrence, key = self._aggregate(occurrence, now)
        series = self._series.find(key)
        if series is not None and now - series.last > SERIES_FINISH:
            series = None
        if series is None:
            event = self._event(occurrence, now)
            series = _Series(event["metadata"]["name"], event, 1, now)
            self._series.touch(key, series)
            write = Write(event)
        else:
            series.count += 1
            series.last = now
            write = Write(series.event, {"count": series.count,
                                         "lastObservedTime": micro_time(now)})
        if not self._allowed(now, occurrence.regarding or self.regarding):
            self.filtered += 1
            return None
        series.reported = series.count
        return write

    def finish(self) -> list[Write]:
        """Series not seen for :data:`SERIES_FINISH`: forgotten, after one last write of
        their count where the spam filter held it back (client-go's ``finishSeries``, which
        the filter does not gate either)."""
        now = self.clock()
        writes = []
        for key, series in list(self._series.items()):
            if now - series.last <= SERIES_FINISH:
                continue
            del self._series[key]
            if series.count > series.reported:
                writes.append(Write(series.event, {"count": series.count,
                                                   "lastObservedTime": micro_time(series.last)}))
        return writes

    def _aggregate(self, occurrence: Occurrence,
                   now: float) -> tuple[Occurrence, tuple[str, ...]]:
        """The occurrence as it is to be recorded, and its series key: its own, or that of
        its type, reason and action once those come with too many different notes (the
        combined Event keeps the note it was made with: a note cannot be changed)."""
        key = (occurrence.type, occurrence.reason, occurrence.action,
               occurrence.regarding or self.regarding)
        similar = self._similar.find(key)
        if similar is None or now - similar.last > AGGREGATE_INTERVAL:
            similar = _Similar()
        similar.notes.add(occurrence.note)
        similar.last = now
        self._similar.touch(key, similar)
        if len(similar.notes) < AGGREGATE_MAX:
            return occurrence, (*key, occurrence.note)
        similar.notes.discard(next(iter(similar.notes)))  # never more than the max
        return Occurrence(occurrence.type, occurrence.reason, occurrence.action,
                          "(combined from similar events): " + occurrence.note,
                          occurrence.regarding), (*key, "")

    def _allowed(self, now: float, regarding: Regarding) -> bool:
        key = (self.controller, self.instance, regarding)
        bucket = self._buckets.find(key)
        if bucket is None:
            bucket = TokenBucket(SPAM_BURST, SPAM_REFILL, now)
            self._buckets.touch(key, bucket)
        return bucket.take(now)

    def _stamp(self, now: float) -> int:
        """Nanoseconds for a new Event's name, never the same twice: two Events made in one
        scan may read the same clock, and the second create would meet the first (409)."""
        self._last_stamp = max(int(now * 1e9), self._last_stamp + 1)
        return self._last_stamp

    def _event(self, occurrence: Occurrence, now: float) -> dict[str, Any]:
        regarding = occurrence.regarding or self.regarding
        reference = {"apiVersion": regarding.api_version, "kind": regarding.kind,
                     "name": regarding.name}
        if regarding.namespace:
            reference["namespace"] = regarding.namespace
        if regarding.uid:
            reference["uid"] = regarding.uid
        return {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": event_name(regarding.name, self._stamp(now)),
                         "namespace": regarding.namespace or NAMESPACE},
            "eventTime": micro_time(now),
            "type": occurrence.type,
            "reason": occurrence.reason[:SHORT_LIMIT],
            "action": occurrence.action[:SHORT_LIMIT],
            "note": cut_note(occurrence.note),
            "regarding": reference,
            "reportingController": self.controller,
            "reportingInstance": self.instance,
        }


def event_name(object_name: str, nanoseconds: int) -> str:
    """``<object>.<nanoseconds in hex>``, as client-go names them (at most 253 characters)."""
    suffix = f".{nanoseconds:x}"
    return object_name[:253 - len(suffix)] + suffix


def micro_time(now: float) -> str:
    """A MicroTime: RFC 3339 with microseconds, in UTC."""
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def cut_note(note: str) -> str:
    """At most :data:`NOTE_LIMIT` bytes of UTF-8, cut on a character boundary."""
    raw = note.encode()
    if len(raw) <= NOTE_LIMIT:
        return note
    return raw[:NOTE_LIMIT - 3].decode(errors="ignore") + "..."


class EventRecorder:
    """Records occurrences about one object without ever waiting on the API server.

    :meth:`record` may be called from anywhere on the event loop; :meth:`run` is the one task
    that writes (start it once, cancel it to stop)."""

    def __init__(self, correlator: Correlator, sink: EventSink,
                 sleep: Callable[[float], Any] = asyncio.sleep,
                 finish_every: float = FINISH_EVERY) -> None:
        self.correlator = correlator
        self.sink = sink
        self._sleep = sleep
        self._finish_every = finish_every
        self._queue: deque[Write] = deque()
        self._ready = asyncio.Event()
        self._said: set[str] = set()
        self._overflowing = False
        self._uid: str | None = None
        self._uid_tried = float("-inf")
        self._said_uid: set[str] = set()
        self.dropped = 0
        self.written = 0

    @property
    def pending(self) -> int:
        return len(self._queue)

    def record(self, occurrence: Occurrence) -> None:
        write = self.correlator.correlate(occurrence)
        if write is not None:
            self._enqueue(write)

    def _enqueue(self, write: Write) -> None:
        if len(self._queue) >= QUEUE_LIMIT:
            self.dropped += 1
            if not self._overflowing:
                self._overflowing = True
                log.warning("%d Kubernetes Events wait to be written; dropping new ones until "
                            "the API server takes them", QUEUE_LIMIT)
            return
        self._queue.append(write)
        self._ready.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        next_finish = loop.time() + self._finish_every
        try:
            while True:
                if loop.time() >= next_finish:  # idle or busy alike
                    for write in self.correlator.finish():
                        self._enqueue(write)
                    next_finish = loop.time() + self._finish_every
                if not self._queue:
                    self._ready.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout_at(next_finish):
                            await self._ready.wait()
                    continue
                write = self._queue[0]
                await self._send(write)
                self._queue.popleft()
                if self._overflowing and len(self._queue) < QUEUE_LIMIT // 2:
                    self._overflowing = False
        finally:
            await self.sink.close()

    async def _send(self, write: Write) -> None:
        delay = RETRY_INITIAL
        for attempt in range(1, MAX_TRIES + 1):
            try:
                await self._write(write)
            except SinkFailure as failure:
                self._say(failure, write)
                if not failure.retry or attempt == MAX_TRIES:
                    self.dropped += 1
                    return
                await self._sleep(delay)
                delay = min(delay * 2, RETRY_MAX)
                continue
            self.written += 1
            if self._said:
                log.info("Kubernetes Events are written again (%s)", write.event["reason"])
                self._said.clear()
            return

    async def _write(self, write: Write) -> None:
        event = write.event
        await self._learn_uid()
        if self._uid is not None and "uid" not in event["regarding"]:
            event["regarding"]["uid"] = self._uid
        namespace = event["metadata"]["namespace"]
        if write.series is not None:
            try:
                await self.sink.patch(namespace, write.name, {"series": write.series})
                return
            except SinkFailure as failure:
                if not failure.not_found:
                    raise
            # Gone (an Event lives an hour by default): made anew, with its count.
            event = {**event, "series": write.series}
        await self.sink.create(namespace, event)

    async def _learn_uid(self) -> None:
        """The regarding object's UID, as client-go's references carry it; an Event is
        written without it while it cannot be read, and it is read again now and then."""
        now = self.correlator.clock()
        if self._uid is not None or now - self._uid_tried < UID_RETRY:
            return
        self._uid_tried = now
        try:
            self._uid = await self.sink.uid()
        except SinkFailure as failure:
            if failure.kind in self._said_uid:
                return
            self._said_uid.add(failure.kind)
            regarding = self.correlator.regarding
            log.warning("cannot read %s %s for its UID: %s; writing "
                           "its Events without it", regarding.kind, regarding.name, failure)

    def _say(self, failure: SinkFailure, write: Write) -> None:
        then = ("trying again with back-off" if failure.retry
                else "dropping it and the Events that fail alike")
        regarding = self.correlator.regarding
        self._say_once(failure.kind, "cannot write Kubernetes Event %s about %s %s: %s; %s "
                       "(serving goes on; said once until Events are written again)",
                       write.event["reason"], regarding.kind, regarding.name, failure, then)

    def _say_once(self, kind: str, message: str, *args: Any) -> None:
        if kind not in self._said:
            self._said.add(kind)
            log.warning(message, *args)
