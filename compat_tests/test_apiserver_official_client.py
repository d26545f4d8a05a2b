"""The official Kubernetes Python client works against the emulator unchanged.

An independent client implementation reads the emulator's kubeconfig (TLS with its CA, bearer
token), decodes its objects into typed models, follows its watch framing and raises ApiException
with the Status the server sent. If the emulator's wire format drifted from a real server's,
this is where a client that was not written against the emulator would notice. The client is
synchronous, so each call runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import watch as k8s_watch
from kubernetes.client.rest import ApiException

from compat_tests.apiserver import objects as o

DRIVER = "fpga.example.com"


@pytest.fixture
async def official(start_api, tmp_path):
    api, _ = await start_api("1.36", tls=True,
                             runtime_config="resource.k8s.io/v1beta1=true")
    api.create_node("node-a")
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    api_client = k8s_config.new_client_from_config(config_file=str(kubeconfig))
    yield api, api_client
    api_client.close()


async def test_typed_crud_and_conflict(official):
    _, api_client = official
    resource = k8s.ResourceV1Api(api_client)
    body = o.resource_slice("", driver=DRIVER, node_name="node-a", devices=[
        o.device("fpga-0", {"model": "u250"}, {"memory": "1024Mi"})])
    body["metadata"] = {"generateName": "node-a-fpga-"}
    created = await asyncio.to_thread(resource.create_resource_slice, body)
    assert created.metadata.name.startswith("node-a-fpga-")
    assert created.spec.devices[0].capacity["memory"].value == "1Gi"
    listed = await asyncio.to_thread(resource.list_resource_slice,
                                     field_selector="spec.nodeName=node-a")
    assert [s.metadata.name for s in listed.items] == [created.metadata.name]
    stale = api_client.sanitize_for_serialization(created)
    stale["spec"]["pool"]["generation"] = 1
    await asyncio.to_thread(resource.replace_resource_slice, created.metadata.name, stale)
    with pytest.raises(ApiException) as conflict:
        await asyncio.to_thread(resource.replace_resource_slice, created.metadata.name, stale)
    assert conflict.value.status == 409
    assert json.loads(conflict.value.body)["reason"] == "Conflict"
    old = k8s.ResourceV1beta1Api(api_client)
    as_beta = await asyncio.to_thread(old.read_resource_slice, created.metadata.name)
    assert as_beta.spec.devices[0].basic.attributes["model"].string == "u250"
    node = await asyncio.to_thread(k8s.CoreV1Api(api_client).read_node, "node-a")
    assert node.metadata.uid
    await asyncio.to_thread(resource.delete_collection_resource_slice,
                            field_selector="spec.nodeName=node-a")
    assert (await asyncio.to_thread(resource.list_resource_slice)).items == []


async def test_watch_stream_and_allocated_claims(official):
    api, api_client = official
    resource = k8s.ResourceV1Api(api_client)
    api.create_allocated_claim("default", "c1", driver=DRIVER, pool="node-a",
                               devices=["fpga-0"])
    claim = await asyncio.to_thread(resource.read_namespaced_resource_claim, "c1", "default")
    assert claim.status.allocation.devices.results[0].device == "fpga-0"
    api.create(o.resource_slice("s1", driver=DRIVER, node_name="node-a",
                                devices=[o.device("fpga-0")]))

    def first_event():
        watcher = k8s_watch.Watch()
        for event in watcher.stream(resource.list_resource_slice, timeout_seconds=5):
            watcher.stop()
            return event["type"], event["object"].metadata.name
        return None

    assert await asyncio.to_thread(first_event) == ("ADDED", "s1")
    with pytest.raises(ApiException) as missing:
        await asyncio.to_thread(resource.read_resource_slice, "nope")
    assert missing.value.status == 404
