"""``serve --api auto`` and the Node label ``accelerator.b-com.com/api``: one node pinned, sent
back, asked for DRA where its kubelet cannot take it, given a bad value, and with no right to
watch Nodes.

Set up as test_dra_auto.py: a DeviceClass mapping ``b-com.com/accelerator``, the emulated 1.36
API server, emulated kubelets 1.33 (no DRA) and 1.36, the real ``serve`` process. The label is
written as ``kubectl label node`` writes it (a JSON merge patch of the Node), so the plugin
sees it through its own watch of its Node.
"""

from __future__ import annotations

import asyncio
import contextlib

from compat_tests.dra_support import until
from compat_tests.test_dra_auto import (  # noqa: F401
    NODE,
    Node,
    choices,
    cluster,
    fake_node,
    mapped_node,
    start_plugin,
)

LABEL = "accelerator.b-com.com/api"
MOVE = 5.0
"""Bound on one label-driven move (measured well under a second; generous for a loaded
machine: the assertion is that the label moves the node, not a benchmark)."""


def said(plugin, text: str) -> list[dict]:
    return [e for e in plugin.entries() if text in e.get("message", "")]


async def test_label_device_plugin_moves_a_dra_node_and_removing_it_moves_it_back(
        cluster, sockdir, logdir, tmp_path):  # noqa: F811
    api, _ = cluster
    async with mapped_node(cluster, sockdir, logdir, tmp_path, "1.36") as (node, plugin, _):
        await until(node.dra_offers, "1.36: DRA slices")
        watcher = asyncio.create_task(node.watch_both())
        try:
            api.label_node(NODE, LABEL, "device-plugin")
            pinned = await until(lambda: node.device_plugin_offers() and not node.dra_offers(),
                                 "pinned: slices withdrawn, the device plugin registered", MOVE)
            assert not api.list("resourceslices"), "every slice of the node is withdrawn"

            api.label_node(NODE, LABEL, None)  # kubectl label node NODE accelerator...api-
            back = await until(lambda: node.dra_offers() and not node.device_plugin_offers(),
                               "label removed: back on DRA", MOVE)
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        print(f"label-driven moves: to the device plugin {pinned:.3f} s, back {back:.3f} s")
        await until(lambda: len(api.list("events", "default")) == 2, "the moves' Events")
    assert node.both_seen == 0, f"offered both ways in {node.both_seen} of {node.samples}"
    moves = choices(plugin)
    assert [chosen for chosen, _ in moves] == ["DRA", "the device plugin", "DRA"], moves
    assert moves[1][1] == "label accelerator.b-com.com/api=device-plugin"
    assert moves[2][1].startswith("no label accelerator.b-com.com/api (auto); the kubelet "
                                  "registered the DRA driver")
    notes = sorted((e["metadata"]["creationTimestamp"], e["reason"], e["note"])
                   for e in api.list("events", "default"))
    assert ("ServingAPIChanged", "Devices are served through the device plugin instead of "
            "DRA: label accelerator.b-com.com/api=device-plugin") in [n[1:] for n in notes]


async def test_label_dra_on_a_kubelet_without_dra_keeps_the_device_plugin_and_says_why(
        cluster, sockdir, logdir, tmp_path):  # noqa: F811
    api, _ = cluster
    async with mapped_node(cluster, sockdir, logdir, tmp_path, "1.33") as (node, plugin, _):
        await until(node.device_plugin_offers, "1.33: the device plugin")
        api.label_node(NODE, LABEL, "dra")
        entry = await plugin.wait_for_log(
            lambda e: "asks for DRA, but the node stays on the device plugin" in
            e.get("message", ""), timeout=15, what="why the label is not followed")
        assert entry["level"] == "warning"
        assert "no handler registered for plugin type: DRAPlugin" in entry["message"]
        assert node.device_plugin_offers() and not node.dra_offers()
        assert not api.list("resourceslices")
    assert [chosen for chosen, _ in choices(plugin)] == ["the device plugin"]


async def test_a_bad_value_is_said_once_per_value_and_ignored(
        cluster, sockdir, logdir, tmp_path):  # noqa: F811
    api, _ = cluster
    api.label_node(NODE, LABEL, "DRA")  # not a value the label takes: as without it
    async with mapped_node(cluster, sockdir, logdir, tmp_path, "1.36") as (node, plugin, _):
        await until(node.dra_offers, "decided as without the label: DRA")
        await asyncio.sleep(3)  # several safety-net ticks (--kubelet-check-interval 1)
        api.label_node(NODE, LABEL, "both")
        await plugin.wait_for_log(lambda e: "=both is not one of" in e.get("message", ""),
                                  what="the second bad value said")
        await asyncio.sleep(2)
        assert node.dra_offers() and not node.device_plugin_offers()
    bad = said(plugin, "is not one of")
    assert [e["message"].split(": ", 1)[1].split(" is")[0] for e in bad] == [
        "label accelerator.b-com.com/api=DRA", "label accelerator.b-com.com/api=both"], bad
    assert all(e["level"] == "warning" and "device-plugin, dra" in e["message"] for e in bad)
    assert [chosen for chosen, _ in choices(plugin)] == ["DRA"]


async def test_no_right_to_watch_nodes_decides_as_today_with_one_warning(
        cluster, sockdir, logdir, tmp_path):  # noqa: F811
    """The ClusterRole of the previous release grants ``nodes`` get only: the watch is
    refused, decisions go on as without the label, said once; the label is still read (get)
    at the next decision, a kubelet start."""
    api, _ = cluster
    api.faults.deny("list", "nodes")
    api.faults.deny("watch", "nodes")
    async with mapped_node(cluster, sockdir, logdir, tmp_path, "1.36") as (node, plugin, _):
        await until(node.dra_offers, "DRA, as today")
        await asyncio.sleep(3)  # the watch retried with back-off meanwhile
        assert api.find_requests(verb="list", resource="nodes", status=403)
        api.label_node(NODE, LABEL, "device-plugin")
        await asyncio.sleep(1)
        assert node.dra_offers(), "a change is not seen without the watch"
        await node.boot("1.36")  # a kubelet start: a decision, which reads the label
        await until(lambda: node.device_plugin_offers() and not node.dra_offers(),
                    "pinned at the next decision")
    warned = said(plugin, "cannot follow its labels")
    assert len(warned) == 1, warned
    assert warned[0]["level"] == "warning"
    assert "403" in warned[0]["message"] and "nodes get, list and watch" in warned[0]["message"]
    assert [chosen for chosen, _ in choices(plugin)] == ["DRA", "the device plugin"]


async def test_with_api_dra_the_flag_wins_and_a_disagreeing_label_is_said_once(
        cluster, sockdir, logdir, tmp_path):  # noqa: F811
    api, _ = cluster
    api.label_node(NODE, LABEL, "device-plugin")
    async with mapped_node(cluster, sockdir, logdir, tmp_path, "1.36",
                           "--api", "dra") as (node, plugin, _):
        await until(node.dra_offers, "--api dra: DRA whatever the label")
        entry = await plugin.wait_for_log(lambda e: "is not followed" in e.get("message", ""),
                                          what="the flag winning said")
        await asyncio.sleep(2)
        api.label_node(NODE, LABEL, "dra")  # agrees: nothing to say
        await asyncio.sleep(1)
        assert node.dra_offers() and not node.device_plugin_offers()
    assert entry["level"] == "warning"
    assert "label accelerator.b-com.com/api=device-plugin" in entry["message"]
    assert "--api dra" in entry["message"]
    assert len(said(plugin, "is not followed")) == 1


async def test_no_api_server_decides_as_today_with_one_warning(
        cluster, sockdir, logdir, tmp_path):  # noqa: F811
    api, registry = cluster
    api.create_device_class("accelerator.b-com.com", driver="accelerator.b-com.com",
                            extended_resource_name="b-com.com/accelerator")
    node = Node(sockdir, registry, api)
    await node.boot("1.36")
    await api.go_down()
    plugin = start_plugin(sockdir, logdir, registry, fake_node(tmp_path),
                          api.write_kubeconfig(tmp_path / "kc"), tmp_path)
    try:
        await until(node.device_plugin_offers, "the device plugin, as today")
        await asyncio.sleep(3)  # the label watch retried with back-off meanwhile
        await api.come_back()
        await plugin.wait_for_log(lambda e: "labels are watched again" in e.get("message", ""),
                                  timeout=15, what="the label watch working again")
        assert node.device_plugin_offers() and not node.dra_offers()
    finally:
        await node.kubelet.stop()
        plugin.kill()
    warned = said(plugin, "cannot follow its labels")
    assert len(warned) == 1, warned
    assert "unreachable" in warned[0]["message"], warned
    [(chosen, why)] = choices(plugin)
    assert chosen == "the device plugin" and "the API server cannot tell" in why
