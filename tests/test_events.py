"""Kubernetes Events: series, similar-event aggregation, the spam filter, and a sender that
never blocks, against an injected clock and a sink that records (or fails) every call."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from compat_tests.dra_support import until
from plugin.process import events
from plugin.process.events import (
    Correlator,
    EventRecorder,
    Occurrence,
    Regarding,
    SinkFailure,
    TokenBucket,
)
from plugin.process.node_events import health_changes
from value_types.devices import Device, DeviceSet, Health

NODE = Regarding("Node", "node-a")
CRASHED = Occurrence("Warning", "DeviceUnhealthy", "CheckHealth",
                     "Device 0000:3b:00.0 of b-com.com/accelerator is Unhealthy: AFU ID is all f")
HEALED = Occurrence("Normal", "DeviceHealthy", "CheckHealth",
                    "Device 0000:3b:00.0 of b-com.com/accelerator is Healthy again")


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def correlator(clock: Clock) -> Correlator:
    return Correlator(NODE, "b-com.com/accelerator-device-plugin", "instance-1", clock)


def test_first_occurrence_is_a_new_event_on_the_node():
    clock = Clock()
    write = correlator(clock).correlate(CRASHED)
    assert write is not None and write.series is None
    event = write.event
    assert event["regarding"] == {"apiVersion": "v1", "kind": "Node", "name": "node-a"}
    assert event["metadata"]["namespace"] == "default"
    assert event["metadata"]["name"].startswith("node-a.")
    assert (event["type"], event["reason"], event["note"]) == (
        "Warning", "DeviceUnhealthy", CRASHED.note)
    assert event["eventTime"].endswith("Z") and "." in event["eventTime"]


def test_a_repeat_patches_the_series_of_the_first_event():
    clock = Clock()
    c = correlator(clock)
    first = c.correlate(CRASHED)
    clock.now += 5
    c.correlate(HEALED)
    clock.now += 5
    again = c.correlate(CRASHED)
    assert first is not None and again is not None
    assert again.name == first.name
    assert again.series == {"count": 2, "lastObservedTime": events.micro_time(clock.now)}
    clock.now += 5
    third = c.correlate(CRASHED)
    assert third is not None and third.series is not None and third.series["count"] == 3


def test_events_made_at_one_instant_get_different_names():
    c = correlator(Clock())
    first, second = c.correlate(CRASHED), c.correlate(HEALED)
    assert first is not None and second is not None and first.name != second.name


def test_a_series_ends_after_six_minutes_of_quiet():
    clock = Clock()
    c = correlator(clock)
    first = c.correlate(CRASHED)
    clock.now += events.SERIES_FINISH + 1
    later = c.correlate(CRASHED)
    assert first is not None and later is not None
    assert later.series is None and later.name != first.name


def test_ten_different_notes_of_one_reason_are_combined():
    clock = Clock()
    c = correlator(clock)
    writes = []
    for n in range(12):
        clock.now += 1
        writes.append(c.correlate(Occurrence("Warning", "DeviceUnhealthy", "CheckHealth",
                                             f"Device {n} is Unhealthy")))
    assert all(w is not None for w in writes)
    separate = [w for w in writes[:events.AGGREGATE_MAX - 1]]
    assert len({w.name for w in separate}) == events.AGGREGATE_MAX - 1
    combined = writes[events.AGGREGATE_MAX - 1:]
    assert combined[0].event["note"].startswith("(combined from similar events): ")
    assert len({w.name for w in combined}) == 1, "one object for every further one"
    assert combined[-1].series is not None and combined[-1].series["count"] == len(combined)


def test_spam_filter_lets_a_burst_of_25_through_then_one_per_five_minutes():
    clock = Clock()
    c = correlator(clock)
    allowed = [c.correlate(CRASHED if n % 2 else HEALED) for n in range(40)]
    assert sum(w is not None for w in allowed) == events.SPAM_BURST
    assert c.filtered == 40 - events.SPAM_BURST
    clock.now += events.SPAM_REFILL - 1
    assert c.correlate(CRASHED) is None
    clock.now += 1
    write = c.correlate(CRASHED)
    assert write is not None and write.series is not None
    assert write.series["count"] == 22, "the held-back occurrences are counted all the same"


def test_a_held_back_count_is_written_when_the_series_finishes():
    clock = Clock()
    c = correlator(clock)
    for n in range(30):
        c.correlate(CRASHED if n % 2 else HEALED)
    clock.now += events.SERIES_FINISH + 1
    finals = {w.event["reason"]: w.series for w in c.finish()}
    assert finals["DeviceUnhealthy"]["count"] == 15
    assert finals["DeviceHealthy"]["count"] == 15
    assert c.finish() == []


def test_token_bucket_refills_to_its_burst_only():
    bucket = TokenBucket(2, 10.0, 0.0)
    assert bucket.take(0.0) and bucket.take(0.0) and not bucket.take(0.0)
    assert bucket.take(1000.0) and bucket.take(1000.0) and not bucket.take(1000.0)


def test_notes_are_cut_to_what_the_server_takes():
    assert len(events.cut_note("é" * 2000).encode()) <= events.NOTE_LIMIT


def test_caches_stay_bounded():
    clock = Clock()
    c = correlator(clock)
    for n in range(events.CACHE_LIMIT + 100):
        clock.now += 0.001
        c.correlate(Occurrence("Normal", f"R{n}", "A", "note"))
    assert len(c._series) <= events.CACHE_LIMIT and len(c._similar) <= events.CACHE_LIMIT


# --- the sender ---------------------------------------------------------------------------


class Sink:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.fail: SinkFailure | None = None
        self.hang = False
        self.created: dict[str, dict[str, Any]] = {}

    async def uid(self) -> str | None:
        return "node-uid"

    async def create(self, namespace: str, event: dict[str, Any]) -> None:
        await self._maybe_fail("create", event)
        self.created[event["metadata"]["name"]] = event

    async def patch(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        await self._maybe_fail("patch", patch)
        if name not in self.created:
            raise SinkFailure("not found", "HTTP 404", retry=False, not_found=True)
        self.created[name] = {**self.created[name], **patch}

    async def close(self) -> None:
        pass

    async def _maybe_fail(self, verb: str, body: Any) -> None:
        self.calls.append((verb, body))
        if self.hang:
            await asyncio.Event().wait()
        if self.fail is not None:
            raise self.fail




@pytest.fixture
async def sender():
    clock = Clock()
    sink = Sink()
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        await asyncio.sleep(0)

    recorder = EventRecorder(correlator(clock), sink, sleep=sleep)
    task = asyncio.create_task(recorder.run())
    yield recorder, sink, clock, sleeps
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_sender_creates_then_patches_the_series_with_the_node_uid(sender):
    recorder, sink, clock, _ = sender
    recorder.record(CRASHED)
    clock.now += 1
    recorder.record(CRASHED)
    await until(lambda: recorder.written == 2, "both written")
    [event] = sink.created.values()
    assert event["regarding"]["uid"] == "node-uid"
    assert event["series"]["count"] == 2
    assert [verb for verb, _ in sink.calls] == ["create", "patch"]


async def test_a_series_whose_event_is_gone_is_created_anew(sender):
    recorder, sink, _, _ = sender
    recorder.record(CRASHED)
    await until(lambda: recorder.written == 1, "written")
    sink.created.clear()  # the API server's event TTL
    recorder.record(CRASHED)
    await until(lambda: recorder.written == 2, "written again")
    [event] = sink.created.values()
    assert event["series"]["count"] == 2


async def test_a_refusal_is_said_once_and_drops_the_event(sender, caplog):
    recorder, sink, clock, sleeps = sender
    sink.fail = SinkFailure("403 Forbidden: cannot create events", "HTTP 403", retry=False)
    with caplog.at_level(logging.WARNING, logger="plugin.process.events"):
        for n in range(5):
            clock.now += 1
            recorder.record(Occurrence("Warning", "DeviceUnhealthy", "CheckHealth", f"d{n}"))
        await until(lambda: recorder.dropped == 5, "five dropped")
    assert sleeps == [], "a refusal is not retried"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "403" in warnings[0].getMessage()
    sink.fail = None
    recorder.record(HEALED)
    await until(lambda: recorder.written == 1, "written once allowed")


async def test_an_unavailable_server_is_retried_with_back_off_then_given_up(sender, caplog):
    recorder, sink, _, sleeps = sender
    sink.fail = SinkFailure("API server unreachable", "unreachable", retry=True)
    with caplog.at_level(logging.WARNING, logger="plugin.process.events"):
        recorder.record(CRASHED)
        await until(lambda: recorder.dropped == 1, "given up")
    assert len(sink.calls) == events.MAX_TRIES
    assert sleeps[:3] == [0.2, 0.4, 0.8] and max(sleeps) == events.RETRY_MAX
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


async def test_record_never_waits_and_the_queue_is_bounded(sender, caplog):
    recorder, sink, clock, _ = sender
    sink.hang = True
    recorder.correlator._allowed = lambda now, regarding: True  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="plugin.process.events"):
        for n in range(events.QUEUE_LIMIT + 50):
            clock.now += 1
            recorder.record(Occurrence("Normal", "R", "A", f"n{n}"))
    assert recorder.pending == events.QUEUE_LIMIT
    assert recorder.dropped >= 50
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


async def test_a_held_back_count_reaches_the_server_when_its_series_ends():
    clock = Clock()
    sink = Sink()
    recorder = EventRecorder(correlator(clock), sink, finish_every=0.01)
    for n in range(30):
        recorder.record(CRASHED if n % 2 else HEALED)
    task = asyncio.create_task(recorder.run())
    try:
        await until(lambda: recorder.written == events.SPAM_BURST, "the burst written")
        assert sink.created[next(iter(sink.created))]["series"]["count"] == 13
        clock.now += events.SERIES_FINISH + 1
        await until(lambda: recorder.written == events.SPAM_BURST + 2, "the final counts")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert sorted(e["series"]["count"] for e in sink.created.values()) == [15, 15]


# --- what the node says -------------------------------------------------------------------


def node(*devices: Device) -> DeviceSet:
    return DeviceSet.of(devices)


def test_health_changes_name_device_resource_and_reason():
    ok = Device("0000:3b:00.0", "intel")
    crashed = Device("0000:3b:00.0", "intel", Health.UNHEALTHY, "AFU ID is all f: firmware crashed")
    before, after = node(ok), node(crashed)
    [went] = health_changes(before, {"b-com.com/accelerator": after})
    assert (went.type, went.reason) == ("Warning", "DeviceUnhealthy")
    assert went.note == ("Device 0000:3b:00.0 of b-com.com/accelerator is Unhealthy: "
                         "AFU ID is all f: firmware crashed")
    [back] = health_changes(after, {"b-com.com/accelerator": before})
    assert (back.type, back.reason) == ("Normal", "DeviceHealthy")
    assert health_changes(before, {"b-com.com/accelerator": before}) == []
    assert health_changes(None, {"r": before}) == [], "healthy at start: nothing to say"
    assert len(health_changes(None, {"r": after})) == 1, "unhealthy at start is said"


def test_events_on_needs_a_node_name(capsys, monkeypatch):
    from plugin.cli.config import parse

    monkeypatch.delenv("NODE_NAME", raising=False)
    monkeypatch.delenv("ACCELERATOR_DP_NODE_NAME", raising=False)

    with pytest.raises(SystemExit) as exit_info:
        parse(["serve", "--events", "on"])
    assert exit_info.value.code == 2
    assert "--events on needs --node-name" in capsys.readouterr().err
    assert parse(["serve", "--events", "off"]).events == "off"


def test_events_default_to_where_the_process_has_api_access():
    from plugin.cli.settings import Settings, events_enabled

    assert not events_enabled(Settings())
    assert events_enabled(Settings(api="dra", node_name="n"))
    assert events_enabled(Settings(api="auto", node_name="n"))
    assert not events_enabled(Settings(api="dra", node_name="n", events="off"))
    assert events_enabled(Settings(node_name="n", events="on"))


async def test_a_node_that_cannot_be_read_gets_its_events_without_uid(sender, caplog):
    recorder, sink, clock, _ = sender
    asked: list[float] = []

    async def refuse() -> str | None:
        asked.append(clock.now)
        raise SinkFailure("403 Forbidden: cannot get nodes", "HTTP 403", retry=False)

    sink.uid = refuse  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="plugin.process.events"):
        recorder.record(CRASHED)
        clock.now += 1
        recorder.record(HEALED)
        await until(lambda: recorder.written == 2, "both written")
        clock.now += events.UID_RETRY
        recorder.record(CRASHED)
        await until(lambda: recorder.written == 3, "the third written")
    assert all("uid" not in e["regarding"] for e in sink.created.values())
    assert len(asked) == 2, "read again once a minute, not per Event"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "for its UID" in warnings[0]
