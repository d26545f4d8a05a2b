"""DRA only where the container runtime applies CDI, from the real ``serve``.

DRA hands devices to containers only through CDI, and a runtime that does not apply it (the
containerd 1.6 of Debian 12, say) starts the container without them, telling no one. The
emulated 1.36 API server's Node carries the kubelet's
``status.nodeInfo.containerRuntimeVersion``; the emulated 1.36 kubelet takes the DRA driver,
so only the runtime can keep a node off DRA here. ``--api auto``: containerd 1.6 stays on the
device plugin and says why; 2.0 goes to DRA; 1.7 goes only where ``--runtime-cdi enabled``
declares its ``enable_cdi``; a node on DRA whose runtime turns into one without CDI moves
back, with a ``ServingAPIChanged`` Event saying why. ``--api dra`` on containerd 1.6: a
Warning Event on the Node, and each prepared device's claim status says its runtime may not
apply it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from compat_tests.dra_bench import NAMESPACE, Bench, port_device
from compat_tests.dra_support import until
from compat_tests.test_dra_auto import (  # noqa: F401
    NODE,
    choices,
    cluster,
    mapped_node,
)

OLD = "containerd://1.6.20"
WHY_OLD = "runtime containerd://1.6.20 does not apply CDI (containerd < 1.7)"
SETTLED = 3.0
"""How long a node that stays on the device plugin is watched for a slice: several decisions'
worth (--watcher-wait 2, the safety net every second)."""


@pytest.fixture
def bench(dra_bench: Bench) -> Bench:
    return dra_bench


async def test_auto_keeps_a_containerd_1_6_node_on_the_device_plugin_and_says_why(
        cluster, sockdir, logdir, tmp_path):  # noqa: F811
    api, _ = cluster
    api.set_node_runtime(NODE, OLD)
    async with mapped_node(cluster, sockdir, logdir, tmp_path, "1.36") as (node, plugin, _):
        await until(node.device_plugin_offers, "the device plugin")
        await asyncio.sleep(SETTLED)
        assert not api.list("resourceslices"), "no slice for a node its runtime cannot serve"
        assert node.device_plugin_offers()
        assert node.kubelet is not None and not node.kubelet.dra.endpoints("accelerator.b-com.com")
    moves = choices(plugin)
    assert moves == [("the device plugin", f"{WHY_OLD}, and DRA hands devices to containers "
                                           "only through CDI")], moves


@pytest.mark.parametrize(("runtime", "extra", "chosen"), [
    ("containerd://2.0.0", (), "DRA"),
    ("containerd://v1.7.2", ("--runtime-cdi", "enabled"), "DRA"),
    ("containerd://v1.7.2", (), "the device plugin"),
])
async def test_auto_follows_the_runtime_and_the_declaration(
        cluster, sockdir, logdir, tmp_path, runtime, extra, chosen):  # noqa: F811
    api, _ = cluster
    api.set_node_runtime(NODE, runtime)
    async with mapped_node(cluster, sockdir, logdir, tmp_path, "1.36", *extra) as (
            node, plugin, _):
        if chosen == "DRA":
            await until(lambda: node.dra_offers() and not node.device_plugin_offers(), "DRA")
        else:
            await until(node.device_plugin_offers, "the device plugin")
            await asyncio.sleep(SETTLED)
            assert not api.list("resourceslices")
    moves = choices(plugin)
    assert [through for through, _ in moves] == [chosen], moves
    if chosen != "DRA":
        assert "enable_cdi = true" in moves[0][1] and "--runtime-cdi enabled" in moves[0][1]


async def test_a_dra_node_whose_runtime_loses_cdi_moves_back_with_an_event_saying_why(
        cluster, sockdir, logdir, tmp_path):  # noqa: F811
    """containerd downgraded under a running kubelet: the kubelet's next status update
    writes the new containerRuntimeVersion, which the plugin's watch of its Node sees."""
    api, _ = cluster
    async with mapped_node(cluster, sockdir, logdir, tmp_path, "1.36") as (node, plugin, _):
        await until(node.dra_offers, "DRA on containerd 2.1")
        api.set_node_runtime(NODE, OLD)
        try:
            await until(lambda: node.device_plugin_offers() and not node.dra_offers(),
                        "back on the device plugin")
        except AssertionError as exc:
            raise AssertionError(f"{exc} (slices left: {node.dra_offers()}, device plugin "
                                 f"offering: {node.device_plugin_offers()})\nplugin log:\n"
                                 f"{plugin.text()[-6000:]}") from None
        await until(lambda: api.list("events", "default"), "the move's Event")
    assert [through for through, _ in choices(plugin)] == ["DRA", "the device plugin"]
    (event,) = api.list("events", "default")
    assert (event["type"], event["reason"]) == ("Normal", "ServingAPIChanged")
    assert event["note"] == ("Devices are served through the device plugin instead of DRA: "
                             f"{WHY_OLD}, and DRA hands devices to containers only through "
                             "CDI"), event


def runtime_condition(bench: Bench, claim: str, device: str) -> dict[str, Any]:
    found = bench.api.get("resourceclaims", claim, NAMESPACE) or {}
    for entry in found.get("status", {}).get("devices", []):
        if entry["device"] == device:
            return {c["type"]: c for c in entry.get("conditions", [])}.get(
                "RuntimeAppliesCDI", {})
    return {}


async def test_api_dra_on_containerd_1_6_warns_on_the_node_and_in_each_claim(bench):
    await bench.start_api()
    bench.api.set_node_runtime(NODE, OLD)
    await bench.start_kubelet()
    plugin = bench.serve(bench.kubeconfig(), extra=["--events", "on"])
    await bench.published(plugin)
    _, name = port_device(bench, "5e", 0)
    claim = bench.claim("on-old-runtime", [name])
    outcome = await bench.dra.prepare([claim])
    assert outcome.ok, outcome.error  # served: --api dra is the operator's choice

    await bench.until_alive(plugin, lambda: runtime_condition(bench, "on-old-runtime", name),
                            "the runtime condition in the claim's status")
    condition = runtime_condition(bench, "on-old-runtime", name)
    assert (condition["status"], condition["reason"]) == ("False", "RuntimeWithoutCDI")
    assert condition["message"].startswith(WHY_OLD), condition
    assert "may start without this device" in condition["message"]
    stored = bench.api.get("resourceclaims", "on-old-runtime", NAMESPACE)
    assert bench.api.validate(stored) == [], "the 1.36 schema of AllocatedDeviceStatus"

    await bench.until_alive(plugin, lambda: [e for e in bench.api.list("events", "default")
                                             if e["reason"] == "RuntimeWithoutCDI"],
                            "the Warning Event on the Node")
    (event,) = [e for e in bench.api.list("events", "default")
                if e["reason"] == "RuntimeWithoutCDI"]
    assert event["type"] == "Warning"
    assert event["regarding"]["kind"] == "Node" and event["regarding"]["name"] == NODE
    assert WHY_OLD in event["note"], event
    warned = [e for e in plugin.entries() if "which DRA hands over through CDI only"
              in e.get("message", "")]
    assert len(warned) == 1 and warned[0]["level"] == "warning", warned


async def test_a_node_that_cannot_be_read_keeps_the_device_plugin_and_says_so(
        cluster, sockdir, logdir, tmp_path):  # noqa: F811
    """No right to read Nodes (a ClusterRole without ``nodes``): the runtime is unknown, so
    the node is not moved to DRA (fail safe), and the log says what is missing."""
    api, _ = cluster
    for verb in ("get", "list", "watch"):
        api.faults.deny(verb, "nodes")
    async with mapped_node(cluster, sockdir, logdir, tmp_path, "1.36") as (node, plugin, _):
        await until(node.device_plugin_offers, "the device plugin")
        await asyncio.sleep(SETTLED)
        assert not api.list("resourceslices")
    [(chosen, why)] = choices(plugin)
    assert chosen == "the device plugin"
    assert why.startswith("the Node's status.nodeInfo.containerRuntimeVersion could not be "
                          "read"), why
    (warned,) = [e for e in plugin.entries() if "nodes get, list and watch" in e.get("message", "")]
    assert "container runtime unknown" in warned["message"], warned
