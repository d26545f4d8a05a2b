"""The label watch of one Node against the emulated API server: values as they change, a
watch whose version expired (410) listed again, a deleted Node read as no label, and a GET
while the watch is not live."""

from __future__ import annotations

import asyncio
import contextlib

from compat_tests.dra_support import until
from plugin.serving.dra.apiserver import ApiServer
from plugin.serving.dra.node_labels import NodeLabelWatch

LABEL = "accelerator.b-com.com/api"


async def test_labels_followed_through_expiry_and_deletion(api, tmp_path):
    api.create_node("node-a", {"kubernetes.io/hostname": "node-a"})
    api.create_node("node-b")
    server = ApiServer.connect(api.write_kubeconfig(tmp_path / "kc"))
    seen: list[dict[str, str]] = []
    watch = NodeLabelWatch("node-a", lambda: server, lambda labels: seen.append(dict(labels)))
    task = asyncio.create_task(watch.run())
    try:
        await until(lambda: watch.live, "listed and watching")
        assert seen == [{"kubernetes.io/hostname": "node-a"}]
        api.label_node("node-b", LABEL, "dra")  # another node: not seen
        api.label_node("node-a", LABEL, "dra")
        await until(lambda: seen[-1].get(LABEL) == "dra", "the new value")
        api.label_node("node-b", LABEL, "auto")  # a write past the last version it saw
        api.expire_resource_versions()
        api.end_watches()  # made anew from the last version, which is gone: 410, listed again
        api.label_node("node-a", LABEL, "device-plugin")
        await until(lambda: seen[-1].get(LABEL) == "device-plugin", "the value after a relist")
        assert len(api.find_requests(verb="list", resource="nodes")) == 2, "listed again"
        api.delete_node("node-a")
        await until(lambda: seen[-1] == {}, "a deleted Node: no label")
        assert [s.get(LABEL) for s in seen] == [None, "dra", "device-plugin", None]
        assert not [r for r in api.find_requests(resource="nodes") if r.name == "node-b"]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await server.close()


async def test_read_gets_the_node_while_the_watch_is_not_live(api, tmp_path):
    api.create_node("node-a", {LABEL: "device-plugin"})
    server = ApiServer.connect(api.write_kubeconfig(tmp_path / "kc"))
    seen: list[dict[str, str]] = []
    watch = NodeLabelWatch("node-a", lambda: server, lambda labels: seen.append(dict(labels)))
    try:
        assert await watch.read() == {LABEL: "device-plugin"}
        assert api.find_requests(verb="get", resource="nodes")
        api.faults.deny("get", "nodes")
        api.label_node("node-a", LABEL, "dra")
        assert await watch.read() == {LABEL: "device-plugin"}, "the last value read"
        assert seen == [{LABEL: "device-plugin"}]
    finally:
        await server.close()


async def test_the_runtime_is_followed_from_the_same_node(api, tmp_path):
    """The kubelet's ``containerRuntimeVersion`` comes with the labels: read by a GET,
    each new value told, a relabel alone telling nothing of it."""
    api.create_node("node-a", runtime="containerd://1.6.20")
    server = ApiServer.connect(api.write_kubeconfig(tmp_path / "kc"))
    runtimes: list[str] = []
    watch = NodeLabelWatch("node-a", lambda: server, lambda labels: None,
                           runtime_changed=runtimes.append)
    assert watch.runtime is None, "never read"
    assert await watch.read() == {}
    assert watch.runtime == "containerd://1.6.20"
    task = asyncio.create_task(watch.run())
    try:
        await until(lambda: watch.live, "listed and watching")
        api.label_node("node-a", LABEL, "dra")
        api.set_node_runtime("node-a", "containerd://2.1.4")
        await until(lambda: watch.runtime == "containerd://2.1.4", "the new runtime")
        assert runtimes == ["containerd://1.6.20", "containerd://2.1.4"]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await server.close()
