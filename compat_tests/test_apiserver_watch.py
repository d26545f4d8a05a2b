"""Watches on the emulator behave as on a kube-apiserver: framing, start points, selectors, 410."""

from __future__ import annotations

import asyncio

from compat_tests.apiserver import objects as o
from compat_tests.apiserver.client import path

DRIVER = "fpga.example.com"
SLICES = path("resourceslices")


def a_slice(name, node="node-a"):
    return o.resource_slice(name, driver=DRIVER, node_name=node, devices=[o.device("fpga-0")])


async def collect(stream, count, timeout=5.0):
    """The next ``count`` events of a watch, fewer if it ends; TimeoutError if neither."""
    events = []

    async def take():
        async for event in stream:
            events.append(event)
            if len(events) == count:
                return

    await asyncio.wait_for(take(), timeout)
    return events


async def test_field_selected_watch_sees_only_its_nodes_slices(api, client):
    stream = client.watch(SLICES, fieldSelector="spec.nodeName=node-a", resourceVersion="0")
    first = asyncio.ensure_future(collect(stream, 3))
    await asyncio.sleep(0.2)
    assert (await client.create(SLICES, a_slice("b-1", "node-b"))).status == 201
    created = (await client.create(SLICES, a_slice("a-1", "node-a"))).body
    await client.patch(path("resourceslices", "v1", "b-1"), {"spec": {"pool": {"generation": 2}}})
    await client.patch(path("resourceslices", "v1", "a-1"), {"spec": {"pool": {"generation": 2}}})
    await client.delete(path("resourceslices", "v1", "a-1"))
    events = await first
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "a-1"), ("MODIFIED", "a-1"), ("DELETED", "a-1")]
    assert events[0]["object"]["kind"] == "ResourceSlice"
    assert events[0]["object"]["apiVersion"] == "resource.k8s.io/v1"
    assert events[0]["object"]["metadata"]["uid"] == created["metadata"]["uid"]
    revisions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert revisions == sorted(revisions)


async def test_watch_without_revision_starts_with_current_objects(client):
    await client.create(SLICES, a_slice("a-1"))
    await client.create(SLICES, a_slice("a-2"))
    events = await collect(client.watch(SLICES), 2)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "a-1"), ("ADDED", "a-2")]


async def test_watch_in_v1beta1_gets_v1beta1_objects(client):
    stream = client.watch(path("resourceslices", "v1beta1"))
    pending = asyncio.ensure_future(collect(stream, 1))
    await asyncio.sleep(0.2)
    await client.create(SLICES, a_slice("a-1"))
    (event,) = await pending
    assert event["object"]["apiVersion"] == "resource.k8s.io/v1beta1"
    assert event["object"]["spec"]["devices"] == [{"name": "fpga-0", "basic": {}}]


async def test_watch_resumes_from_a_revision(client):
    first = (await client.create(SLICES, a_slice("a-1"))).body
    await client.create(SLICES, a_slice("a-2"))
    await client.delete(path("resourceslices", "v1", "a-1"))
    events = await collect(client.watch(SLICES, resourceVersion=first["metadata"][
        "resourceVersion"]), 2)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "a-2"), ("DELETED", "a-1")]


async def test_watch_from_an_expired_revision_gets_410_expired(api, client):
    old = (await client.create(SLICES, a_slice("a-1"))).body["metadata"]["resourceVersion"]
    await client.create(SLICES, a_slice("a-2"))
    api.expire_resource_versions()
    events = [e async for e in client.watch(SLICES, resourceVersion=old)]
    assert len(events) == 1
    error = events[0]
    assert error["type"] == "ERROR"
    assert error["object"]["kind"] == "Status"
    assert error["object"]["code"] == 410
    assert error["object"]["reason"] == "Expired"
    assert error["object"]["message"] == f"too old resource version: {old} ({api.store.revision})"
    assert api.find_requests(verb="watch")[-1].status == 200  # 410 arrives inside the stream


async def test_a_small_watch_window_expires_old_revisions_by_itself(start_api):
    _, client = await start_api("1.36", watch_window=3)
    start = (await client.create(SLICES, a_slice("a-0"))).body["metadata"]["resourceVersion"]
    for index in range(1, 5):
        await client.create(SLICES, a_slice(f"a-{index}"))
    events = [e async for e in client.watch(SLICES, resourceVersion=start)]
    assert events[0]["object"]["reason"] == "Expired"


async def test_label_selected_watch_sees_objects_leave_and_enter(client):
    labelled = a_slice("a-1")
    labelled["metadata"]["labels"] = {"tier": "gold"}
    await client.create(SLICES, labelled)
    stream = client.watch(SLICES, labelSelector="tier=gold")
    pending = asyncio.ensure_future(collect(stream, 3))
    await asyncio.sleep(0.2)
    target = path("resourceslices", "v1", "a-1")
    await client.patch(target, {"metadata": {"labels": {"tier": "silver"}}})
    await client.patch(target, {"metadata": {"labels": {"tier": "gold"}}})
    assert [e["type"] for e in await pending] == ["ADDED", "DELETED", "ADDED"]


async def test_timeout_and_end_watches_end_streams_cleanly(api, client):
    events = [e async for e in client.watch(SLICES, timeoutSeconds="1")]
    assert events == []
    stream = client.watch(SLICES, resourceVersion=str(api.store.revision))
    pending = asyncio.ensure_future(collect(stream, 1, timeout=3))
    await asyncio.sleep(0.2)
    assert api.end_watches() == 1
    assert await pending == []  # the stream ended cleanly, well before collect's timeout
    assert api.store.watchers == set()


async def test_bookmarks_and_initial_events_end(start_api):
    api, client = await start_api("1.36", bookmark_interval=0.2)
    await client.create(SLICES, a_slice("a-1"))
    stream = client.watch(SLICES, sendInitialEvents="true", allowWatchBookmarks="true",
                          resourceVersionMatch="NotOlderThan")
    events = await collect(stream, 3)
    assert [e["type"] for e in events] == ["ADDED", "BOOKMARK", "BOOKMARK"]
    assert events[1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert events[1]["object"]["metadata"]["resourceVersion"] == str(api.store.revision)
    assert events[1]["object"]["kind"] == "ResourceSlice"


async def test_watching_a_future_revision_times_out_with_504(api, client):
    future = str(api.store.revision + 100)
    (reply,) = [e async for e in client.watch(SLICES, resourceVersion=future)]
    assert reply["status"] == 504
    assert reply["object"]["message"].startswith("Too large resource version")
