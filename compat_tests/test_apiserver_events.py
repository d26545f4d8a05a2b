"""The emulated API server's events.k8s.io/v1: discovery, create, series patch, list, and the
1.36 schema and validation rules every Event is held to; RBAC refusals and a hanging resource."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from compat_tests.apiserver import events as events_api

EVENTS = "/apis/events.k8s.io/v1/namespaces/default/events"


def event(name: str = "node-a.17979d008a35e400", **changes: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": name, "namespace": "default"},
        "eventTime": "2026-11-25T17:00:00.123456Z", "type": "Warning",
        "reason": "DeviceUnhealthy", "action": "CheckHealth",
        "note": "Device 0000:3b:00.0 of b-com.com/accelerator is Unhealthy: AFU ID is all f",
        "regarding": {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "u-1"},
        "reportingController": "b-com.com/accelerator-device-plugin",
        "reportingInstance": "accelerator-device-plugin-pod-1",
    }
    obj.update(changes)
    return obj


async def test_discovery_serves_events_k8s_io_v1(api, client):
    groups = (await client.get("/apis")).body["groups"]
    assert "events.k8s.io" in [g["name"] for g in groups]
    assert (await client.get("/apis/events.k8s.io")).body["preferredVersion"]["version"] == "v1"
    [resource] = (await client.get("/apis/events.k8s.io/v1")).body["resources"]
    assert (resource["name"], resource["kind"], resource["namespaced"]) == (
        "events", "Event", True)
    assert {"create", "patch", "list"} <= set(resource["verbs"])


async def test_create_patch_series_and_list(api, client):
    created = await client.create(EVENTS, event())
    assert created.status == 201, created.body
    assert created.body["metadata"]["uid"]
    name = created.body["metadata"]["name"]
    series = {"series": {"count": 2, "lastObservedTime": "2026-11-25T17:00:05.000000Z"}}
    patched = await client.patch(f"{EVENTS}/{name}", series,
                                 content_type="application/strategic-merge-patch+json")
    assert patched.status == 200, patched.body
    listed = (await client.get(EVENTS)).body
    assert listed["kind"] == "EventList"
    [stored] = listed["items"]
    assert stored["series"]["count"] == 2
    assert api.events.refusals == []


async def test_every_event_is_held_to_the_136_schema_and_rules(api, client):
    bad = {
        "unknown field": event(colour="red"),
        "wrong type": event(note=5),
        "count set": event(deprecatedCount=1),
        "no reporting controller": event(reportingController=""),
        "controller not a qualified name": event(reportingController="not/a/qualified/name"),
        "bad type": event(type="Fatal"),
        "no eventTime": {k: v for k, v in event().items() if k != "eventTime"},
        "series of one": event(series={"count": 1,
                                       "lastObservedTime": "2026-11-25T17:00:05.000000Z"}),
        "note too long": event(note="x" * 1025),
        "other namespace for a Node": event(metadata={"name": "n.1", "namespace": "kube-public"}),
    }
    api.create_namespace("kube-public")
    for what, body in bad.items():
        namespace = body["metadata"]["namespace"]
        reply = await client.create(f"/apis/events.k8s.io/v1/namespaces/{namespace}/events",
                                    body)
        assert reply.status in (400, 422), f"{what}: {reply.status} {reply.body}"
        assert events_api.validate(body), what
    assert len(api.events.refusals) == len(bad)
    assert events_api.validate(event()) == []


async def test_a_note_cannot_change_on_update(api, client):
    created = (await client.create(EVENTS, event())).body
    name = created["metadata"]["name"]
    reply = await client.patch(f"{EVENTS}/{name}", {"note": "another"})
    assert reply.status == 422 and "immutable" in reply.message
    old = copy.deepcopy(created)
    assert events_api.validate({**created, "note": "x"}, old)


async def test_rbac_refuses_and_a_resource_can_hang(api, client):
    api.faults.deny("create", "events")
    reply = await client.create(EVENTS, event())
    assert reply.status == 403 and 'cannot create resource "events"' in reply.message
    api.faults.allow("create", "events")
    api.faults.slow_down("create", "events", 30)
    pending = asyncio.ensure_future(client.create(EVENTS, event()))
    await asyncio.sleep(0.3)
    assert not pending.done(), "the create hangs"
    assert (await client.get("/api/v1/nodes")).status == 200, "other resources answer"
    pending.cancel()
