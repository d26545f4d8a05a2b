"""The emulator answers REST requests as a kube-apiserver does: discovery, auth, CRUD semantics.

Every assertion is about what a client sees on the wire: status codes, Status reasons and
messages, resourceVersions, headers. Watches are in test_apiserver_watch.py, faults in
test_apiserver_faults.py.
"""

from __future__ import annotations

import re

import pytest

from compat_tests.apiserver import objects as o
from compat_tests.apiserver.client import ApiClient, path

DRIVER = "fpga.example.com"
SLICES = path("resourceslices")
CLAIMS = path("resourceclaims", namespace="default")


def a_slice(name="node-a-fpga", node="node-a", devices=None):
    return o.resource_slice(name, driver=DRIVER, node_name=node,
                            devices=devices if devices is not None else [o.device("fpga-0")])


# --- discovery ----------------------------------------------------------------------------


@pytest.mark.parametrize(("model", "served"), [
    ("1.32", []), ("1.33", []), ("1.34", ["v1"]), ("1.35", ["v1"]), ("1.36", ["v1"]),
    ("1.37", ["v1"]),
])
async def test_discovery_lists_only_the_versions_a_release_serves(start_api, model, served):
    _, client = await start_api(model)
    groups = [g for g in (await client.get("/apis")).body["groups"]
              if g["name"] != "events.k8s.io"]  # served by every release
    if not served:
        assert groups == []
        assert (await client.get("/apis/resource.k8s.io")).status == 404
    else:
        assert groups[0]["name"] == "resource.k8s.io"
        assert [v["version"] for v in groups[0]["versions"]] == served
        assert groups[0]["preferredVersion"]["version"] == "v1"
    for version in ("v1", "v1beta2", "v1beta1"):
        reply = await client.get(f"/apis/resource.k8s.io/{version}")
        assert reply.status == (200 if version in served else 404)
        slices = await client.get(path("resourceslices", version))
        assert slices.status == (200 if version in served else 404)
        if version not in served:
            assert slices.body == "404 page not found\n"
    assert (await client.get("/version")).body["minor"] == model.split(".")[1]


async def test_a_133_server_with_runtime_config_prefers_v1beta2(start_api):
    _, client = await start_api(
        "1.33", runtime_config="resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true")
    group = (await client.get("/apis/resource.k8s.io")).body
    assert group["preferredVersion"] == {"groupVersion": "resource.k8s.io/v1beta2",
                                         "version": "v1beta2"}
    assert (await client.get(path("resourceslices", "v1"))).status == 404


async def test_resource_list_names_the_dra_resources_and_verbs(client):
    resources = {r["name"]: r for r in
                 (await client.get("/apis/resource.k8s.io/v1")).body["resources"]}
    assert {"resourceslices", "resourceclaims", "resourceclaims/status",
            "deviceclasses"} <= set(resources)
    assert resources["resourceslices"]["namespaced"] is False
    assert resources["resourceclaims"]["namespaced"] is True
    assert resources["resourceslices"]["kind"] == "ResourceSlice"
    assert set(resources["resourceslices"]["verbs"]) == {
        "create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}
    assert resources["resourceclaims/status"]["verbs"] == ["get", "patch", "update"]


async def test_nodes_created_by_a_test_are_served_with_a_uid(api, client):
    created = api.create_node("node-a", {"kubernetes.io/hostname": "node-a"})
    node = (await client.get("/api/v1/nodes/node-a")).body
    assert node["metadata"]["uid"] == created["metadata"]["uid"]
    assert node["kind"] == "Node"
    missing = await client.get("/api/v1/nodes/node-b")
    assert missing.status == 404
    assert missing.message == 'nodes "node-b" not found'


# --- authentication and authorization -----------------------------------------------------


async def test_requests_without_a_known_token_get_401(api):
    async with ApiClient(api.url, None) as anonymous:
        reply = await anonymous.get(SLICES)
    assert reply.status == 401
    assert reply.body == {"kind": "Status", "apiVersion": "v1", "metadata": {},
                          "status": "Failure", "message": "Unauthorized",
                          "reason": "Unauthorized", "code": 401}
    async with ApiClient(api.url, "not-a-token") as wrong:
        assert (await wrong.get("/apis")).status == 401
    assert api.requests[-1].status == 401


async def test_rotated_tokens_take_effect_at_once(api, client):
    assert (await client.get(SLICES)).status == 200
    api.set_tokens({"new-token": "system:serviceaccount:kube-system:fpga"})
    assert (await client.get(SLICES)).status == 401
    async with ApiClient(api.url, "new-token") as rotated:
        assert (await rotated.get(SLICES)).status == 200
    assert api.requests[-1].user == "system:serviceaccount:kube-system:fpga"


async def test_denied_verbs_get_rbac_worded_403(api, client):
    api.faults.deny("list", "resourceslices")
    api.faults.deny("update", "resourceclaims/status")
    reply = await client.get(SLICES)
    assert reply.status == 403
    assert reply.reason == "Forbidden"
    assert reply.message == (
        'resourceslices.resource.k8s.io is forbidden: User "system:serviceaccount:kube-system:'
        'dra-driver" cannot list resource "resourceslices" in API group "resource.k8s.io" at the '
        "cluster scope")
    api.create_claim("default", "c1")
    claim = (await client.get(path("resourceclaims", "v1", "c1", "default"))).body
    status = await client.update(path("resourceclaims", "v1", "c1", "default", "status"), claim)
    assert status.status == 403
    assert 'cannot update resource "resourceclaims/status" in API group "resource.k8s.io" in ' \
        'the namespace "default"' in status.message
    assert (await client.get(path("resourceclaims", "v1", "c1", "default"))).status == 200
    api.faults.allow("list", "resourceslices")
    assert (await client.get(SLICES)).status == 200


# --- create, update, delete ---------------------------------------------------------------


async def test_generate_name_gets_five_random_characters(client):
    body = a_slice()
    body["metadata"] = {"generateName": "node-a-fpga.example.com-"}
    names = set()
    for _ in range(3):
        reply = await client.create(SLICES, body)
        assert reply.status == 201
        names.add(reply.body["metadata"]["name"])
        assert reply.body["metadata"]["generateName"] == "node-a-fpga.example.com-"
    assert len(names) == 3
    assert all(re.fullmatch(r"node-a-fpga\.example\.com-[bcdfghjklmnpqrstvwxz2456789]{5}", n)
               for n in names)


async def test_server_sets_uid_revision_timestamp_and_generation(client):
    body = a_slice()
    body["metadata"]["uid"] = "client-chosen"
    created = (await client.create(SLICES, body)).body["metadata"]
    assert created["uid"] != "client-chosen"
    assert re.fullmatch(r"[0-9a-f-]{36}", created["uid"])
    assert created["generation"] == 1
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", created["creationTimestamp"])
    listed = (await client.get(SLICES)).body
    assert listed["metadata"]["resourceVersion"] == created["resourceVersion"]
    assert "kind" not in listed["items"][0]  # list items carry no TypeMeta


async def test_create_twice_is_409_already_exists(client):
    assert (await client.create(SLICES, a_slice())).status == 201
    again = await client.create(SLICES, a_slice())
    assert again.status == 409
    assert again.reason == "AlreadyExists"
    assert again.message == 'resourceslices.resource.k8s.io "node-a-fpga" already exists'
    with_rv = a_slice("other")
    with_rv["metadata"]["resourceVersion"] = "5"
    refused = await client.create(SLICES, with_rv)
    assert refused.status == 500
    assert refused.message == "resourceVersion should not be set on objects to be created"


async def test_stale_update_is_409_conflict_and_unconditional_update_works(api, client):
    created = (await client.create(SLICES, a_slice())).body
    first = dict(created, spec=dict(created["spec"], pool={**created["spec"]["pool"],
                                                             "generation": 1}))
    updated = await client.update(path("resourceslices", "v1", "node-a-fpga"), first)
    assert updated.status == 200
    assert updated.body["metadata"]["generation"] == 2
    stale = await client.update(path("resourceslices", "v1", "node-a-fpga"), first)
    assert stale.status == 409
    assert stale.reason == "Conflict"
    assert stale.message == (
        'Operation cannot be fulfilled on resourceslices.resource.k8s.io "node-a-fpga": the '
        "object has been modified; please apply your changes to the latest version and try "
        "again")
    assert stale.body["details"] == {"name": "node-a-fpga", "group": "resource.k8s.io",
                                     "kind": "resourceslices"}
    del first["metadata"]["resourceVersion"]
    assert (await client.update(path("resourceslices", "v1", "node-a-fpga"), first)).status == 200


async def test_an_update_that_changes_nothing_keeps_the_revision(api, client):
    created = (await client.create(SLICES, a_slice())).body
    same = await client.update(path("resourceslices", "v1", "node-a-fpga"), created)
    assert same.body["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    assert same.body["metadata"]["generation"] == 1
    labelled = dict(created, metadata={**created["metadata"], "labels": {"a": "b"}})
    changed = (await client.update(path("resourceslices", "v1", "node-a-fpga"), labelled)).body
    assert int(changed["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    assert changed["metadata"]["generation"] == 1  # metadata only: no new generation


async def test_update_checks_name_existence_and_immutable_fields(client):
    created = (await client.create(SLICES, a_slice())).body
    wrong = await client.update(path("resourceslices", "v1", "other"), created)
    assert wrong.status == 400
    assert wrong.message == ("the name of the object (node-a-fpga) does not match the name on "
                             "the URL (other)")
    missing = dict(created, metadata={"name": "gone"})
    assert (await client.update(path("resourceslices", "v1", "gone"), missing)).status == 404
    moved = dict(created, spec={**created["spec"], "nodeName": "node-b"})
    reply = await client.update(path("resourceslices", "v1", "node-a-fpga"), moved)
    assert reply.status == 422
    assert 'spec.nodeName: Invalid value: "node-b": field is immutable' in reply.message


async def test_patches_merge_strategic_and_json(client):
    assert (await client.create(SLICES, a_slice())).status == 201
    target = path("resourceslices", "v1", "node-a-fpga")
    merged = await client.patch(target, {"spec": {"pool": {"generation": 3}}})
    assert merged.body["spec"]["pool"] == {"name": "node-a", "generation": 3,
                                           "resourceSliceCount": 1}
    owner = {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "u-1"}
    strategic = await client.patch(target, {"metadata": {"ownerReferences": [owner]}},
                                   "application/strategic-merge-patch+json")
    assert strategic.status == 200, strategic.body
    assert strategic.body["metadata"]["ownerReferences"] == [owner]
    json_patch = await client.patch(target, [{"op": "replace", "path": "/spec/devices/0/name",
                                              "value": "fpga-9"}], "application/json-patch+json")
    assert json_patch.body["spec"]["devices"][0]["name"] == "fpga-9"
    bad = await client.patch(target, [{"op": "replace", "path": "/spec/devices/0/name",
                                       "value": "Not_A_Label"}], "application/json-patch+json")
    assert bad.status == 422
    stale = await client.patch(target, {"metadata": {"resourceVersion": "1"}})
    assert stale.status == 409
    apply = await client.patch(target, {}, "application/apply-patch+yaml")
    assert apply.status == 415


async def test_delete_returns_the_object_and_deletecollection_by_node(client):
    for name, node in (("a-1", "node-a"), ("a-2", "node-a"), ("b-1", "node-b")):
        assert (await client.create(SLICES, a_slice(name, node))).status == 201
    deleted = await client.delete(path("resourceslices", "v1", "a-1"))
    assert deleted.status == 200
    assert deleted.body["metadata"]["name"] == "a-1"
    gone = await client.delete(path("resourceslices", "v1", "a-1"))
    assert gone.status == 404
    assert gone.message == 'resourceslices.resource.k8s.io "a-1" not found'
    swept = await client.delete(SLICES, fieldSelector="spec.nodeName=node-a")
    assert swept.status == 200
    assert swept.body["kind"] == "ResourceSliceList"
    assert [i["metadata"]["name"] for i in swept.body["items"]] == ["a-2"]
    left = (await client.get(SLICES)).body["items"]
    assert [i["metadata"]["name"] for i in left] == ["b-1"]


async def test_field_selectors_combine_and_unknown_labels_are_400(client):
    await client.create(SLICES, a_slice("a-1", "node-a"))
    other = a_slice("a-2", "node-a")
    other["spec"]["driver"] = "gpu.example.com"
    await client.create(SLICES, other)
    await client.create(SLICES, a_slice("b-1", "node-b"))
    both = await client.get(SLICES, fieldSelector=f"spec.nodeName=node-a,spec.driver={DRIVER}")
    assert [i["metadata"]["name"] for i in both.body["items"]] == ["a-1"]
    negated = await client.get(SLICES, fieldSelector="spec.nodeName!=node-a")
    assert [i["metadata"]["name"] for i in negated.body["items"]] == ["b-1"]
    bad = await client.get(SLICES, fieldSelector="spec.pool.name=x")
    assert bad.status == 400
    assert bad.message == ("field label not supported for resource.k8s.io/v1, "
                           "Kind=ResourceSlice: spec.pool.name")


async def test_list_pages_with_limit_and_continue(client):
    for index in range(5):
        await client.create(SLICES, a_slice(f"s-{index}"))
    first = (await client.get(SLICES, limit="2")).body
    assert [i["metadata"]["name"] for i in first["items"]] == ["s-0", "s-1"]
    assert first["metadata"]["remainingItemCount"] == 3
    second = (await client.get(SLICES, limit="2", **{"continue": first["metadata"]["continue"]}))
    assert [i["metadata"]["name"] for i in second.body["items"]] == ["s-2", "s-3"]


# --- claims and classes -------------------------------------------------------------------


async def test_allocated_claim_helper_and_status_subresource(api, client):
    api.create_device_class("fpga", driver=DRIVER)
    api.create_allocated_claim("default", "c1", driver=DRIVER, pool="node-a",
                               devices=["fpga-0", "fpga-1"], node_name="node-a")
    claim = (await client.get(path("resourceclaims", "v1", "c1", "default"))).body
    results = claim["status"]["allocation"]["devices"]["results"]
    assert [(r["request"], r["driver"], r["pool"], r["device"]) for r in results] == [
        ("req-0", DRIVER, "node-a", "fpga-0"), ("req-0", DRIVER, "node-a", "fpga-1")]
    as_v1beta1 = (await client.get(path("resourceclaims", "v1beta1", "c1", "default"))).body
    assert as_v1beta1["status"] == claim["status"]
    claim["status"]["allocation"]["devices"]["results"][0]["device"] = "fpga-7"
    changed = await client.update(path("resourceclaims", "v1", "c1", "default", "status"), claim)
    assert changed.status == 422
    assert "status.allocation: Invalid value:" in changed.message
    assert changed.message.endswith("field is immutable")


async def test_claim_spec_is_immutable_and_status_is_not_set_on_create(api, client):
    body = o.claim("default", "c1")
    body["status"] = {"allocation": o.allocation([o.result("req-0", DRIVER, "p", "d")])}
    created = await client.create(CLAIMS, body)
    assert created.status == 201
    assert "status" not in created.body or created.body["status"] == {}
    created.body["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "other"
    reply = await client.update(path("resourceclaims", "v1", "c1", "default"), created.body)
    assert reply.status == 422
    assert reply.message.startswith('ResourceClaim.resource.k8s.io "c1" is invalid: spec: '
                                    "Invalid value:")
    reserved = (await client.get(path("resourceclaims", "v1", "c1", "default"))).body
    reserved["status"] = {"reservedFor": [o.pod_reference("pod", "uid-1")]}
    refused = await client.update(path("resourceclaims", "v1", "c1", "default", "status"),
                                  reserved)
    assert refused.status == 422
    assert "status.reservedFor: Forbidden: may not be specified when `allocated` is not set" \
        in refused.message


async def test_claim_result_must_name_a_request_of_the_claim(api):
    api.create_claim("default", "c1")
    with pytest.raises(Exception, match="must be the name of a request in the claim"):
        api.set_claim_status("default", "c1", {"allocation": o.allocation(
            [o.result("other", DRIVER, "p", "d")])})


async def test_claim_in_a_missing_namespace_is_404(client):
    reply = await client.create(path("resourceclaims", namespace="nowhere"),
                                o.claim("nowhere", "c1"))
    assert reply.status == 404
    assert reply.message == 'namespaces "nowhere" not found'


async def test_finalizers_hold_a_delete_until_removed(api, client):
    body = o.claim("default", "c1")
    body["metadata"]["finalizers"] = ["resource.kubernetes.io/delete-protection"]
    await client.create(CLAIMS, body)
    target = path("resourceclaims", "v1", "c1", "default")
    terminating = await client.delete(target)
    assert terminating.status == 200
    assert terminating.body["metadata"]["deletionTimestamp"]
    assert (await client.get(target)).status == 200
    released = await client.patch(target, {"metadata": {"finalizers": None}})
    assert released.status == 200
    assert (await client.get(target)).status == 404


async def test_request_log_records_verb_query_status_and_body(api, client):
    api.clear_requests()
    await client.create(SLICES, a_slice())
    await client.get(SLICES, fieldSelector="spec.nodeName=node-a")
    create, listing = api.requests
    assert (create.verb, create.resource, create.status) == ("create", "resourceslices", 201)
    assert create.body["metadata"]["name"] == "node-a-fpga"
    assert (listing.verb, listing.query, listing.status) == (
        "list", {"fieldSelector": "spec.nodeName=node-a"}, 200)
    assert api.find_requests(verb="create") == [create]
