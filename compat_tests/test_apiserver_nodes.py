"""Nodes on the emulator: labelled as ``kubectl label node`` does it, and watched by name.

What a node-local agent following a label of its own Node sees: a list and a watch with
``fieldSelector=metadata.name=<node>``, a MODIFIED event carrying the new labels at each
``kubectl label`` (a JSON merge patch), and nothing for a patch that changes nothing.
"""

from __future__ import annotations

import asyncio

NODE = "/api/v1/nodes/node-a"
LABEL = "accelerator.b-com.com/api"


async def next_event(stream, timeout=5.0):
    return await asyncio.wait_for(anext(stream), timeout)


async def test_a_label_set_and_removed_is_seen_by_a_watch_on_the_node(api, client):
    api.create_node("node-a", {"kubernetes.io/hostname": "node-a"})
    api.create_node("node-b")
    listed = (await client.get("/api/v1/nodes", fieldSelector="metadata.name=node-a")).body
    assert [n["metadata"]["name"] for n in listed["items"]] == ["node-a"]
    stream = client.watch("/api/v1/nodes", fieldSelector="metadata.name=node-a",
                          resourceVersion=listed["metadata"]["resourceVersion"])
    first = asyncio.ensure_future(next_event(stream))
    await asyncio.sleep(0.2)
    api.label_node("node-b", LABEL, "dra")  # another node: not seen
    reply = await client.patch(NODE, {"metadata": {"labels": {LABEL: "device-plugin"}}})
    assert reply.status == 200, reply.body
    event = await first
    assert event["type"] == "MODIFIED"
    assert event["object"]["metadata"]["labels"] == {"kubernetes.io/hostname": "node-a",
                                                     LABEL: "device-plugin"}
    assert event["object"]["status"]["conditions"], "the status is kept"
    await client.patch(NODE, {"metadata": {"labels": {LABEL: None}}})
    event = await next_event(stream)
    assert event["object"]["metadata"]["labels"] == {"kubernetes.io/hostname": "node-a"}
    await stream.aclose()


async def test_a_patch_that_changes_nothing_keeps_the_revision(api, client):
    api.create_node("node-a", {LABEL: "dra"})
    before = (await client.get(NODE)).body["metadata"]["resourceVersion"]
    reply = await client.patch(NODE, {"metadata": {"labels": {LABEL: "dra"}}})
    assert reply.body["metadata"]["resourceVersion"] == before


async def test_label_values_and_fields_are_checked_as_a_server_checks_them(api, client):
    api.create_node("node-a")
    bad_value = await client.patch(NODE, {"metadata": {"labels": {LABEL: "not ok!"}}})
    assert bad_value.status == 422
    assert bad_value.reason == "Invalid"
    assert "metadata.labels: Invalid value: \"not ok!\"" in bad_value.message
    bad_key = await client.patch(NODE, {"metadata": {"labels": {"a/b/c": "x"}}})
    assert bad_key.status == 422
    unknown = await client.patch(NODE, {"spec": {"notAField": True}})
    assert unknown.status == 400
    status = await client.patch(NODE + "/status", {"metadata": {"labels": {LABEL: "dra"}}})
    assert status.status == 405
    assert "labels" not in (await client.get(NODE)).body["metadata"]


async def test_an_update_with_a_stale_resource_version_conflicts(api, client):
    api.create_node("node-a")
    node = (await client.get(NODE)).body
    api.label_node("node-a", LABEL, "auto")
    node["metadata"]["labels"] = {LABEL: "dra"}
    stale = await client.update(NODE, node)
    assert stale.status == 409
    del node["metadata"]["resourceVersion"]
    node["status"] = {}
    reply = await client.update(NODE, node)
    assert reply.status == 200
    assert reply.body["metadata"]["labels"] == {LABEL: "dra"}
    assert reply.body["status"]["conditions"], "status is not written through the Node"
