"""The emulated kubelet DRA manager's calls: claims, health, slice wiping, restarts, CLI.

Each test drives a fake DRA plugin over real unix sockets and asserts what a kubelet of that
release would hold afterwards: the devices and CDI IDs of each claim, the error it would
report for the pod, whether it calls again, the health it heard, the DeleteCollection calls
it sent.
"""

from __future__ import annotations

import asyncio
import http.server
import os
import signal
import subprocess
import sys
import threading
from typing import ClassVar

import grpc
import pytest

from compat_tests.conftest import FAST_DRA
from compat_tests.fake_dra_plugin import FakeDevice, FakeDraPlugin, registered
from compat_tests.kubelet import KubeletEmulator
from compat_tests.kubelet.dra import DraConfig
from compat_tests.kubelet.dra_results import ClaimRef, PreparedDevice
from compat_tests.kubelet.slices import WipeFailed, delete_collection_url, http_wiper

DRIVER = "fpga.example.com"
FPGA0 = FakeDevice("node-1", "fpga-0", ("accel",), ("b-com.com/accelerator=fpga-0",),
                   share_id="4c1f")


def claim(uid, name=None):
    return ClaimRef("ns", name or f"claim-{uid}", uid, (DRIVER,))


# -- claims ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("model", "share_id"), [("1.34", None), ("1.35", "4c1f")])
async def test_prepare_and_unprepare_round_trip(dra_node, model, share_id):
    kubelet = await dra_node(model)
    plugin = await dra_node.plugin(devices={"u1": (FPGA0,)})
    await registered(kubelet, plugin)

    prepared = await kubelet.dra.prepare([claim("u1")])
    assert prepared.ok, prepared.error
    assert prepared.result("u1").devices == (PreparedDevice(
        ("accel",), "node-1", "fpga-0", ("b-com.com/accelerator=fpga-0",), share_id),)
    assert plugin.claims_seen == [("ns", "u1", "claim-u1")], "only namespace, uid and name"
    assert kubelet.dra.checkpoint.prepared_uids() == {"u1"}

    again = await kubelet.dra.prepare([claim("u1")])
    assert again.ok and again.result("u1").skipped and again.calls == ()
    assert len(plugin.calls) == 1, "a prepared claim is not sent again"

    unprepared = await kubelet.dra.unprepare([claim("u1")])
    assert unprepared.ok, unprepared.error
    assert plugin.calls[-1] == ("/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/"
                                "NodeUnprepareResources", ("u1",))
    assert kubelet.dra.checkpoint.claims == {}
    never = await kubelet.dra.unprepare([claim("u2")])
    assert never.ok and never.result("u2").skipped and len(plugin.calls) == 2


async def test_a_claim_left_out_of_the_map_is_prepared_by_a_later_call(dra_node):
    kubelet = await dra_node("1.34")
    plugin = await dra_node.plugin(devices={"a": (FPGA0,), "b": ()}, omit={"b"})
    await registered(kubelet, plugin)

    first = await kubelet.dra.prepare([claim("a"), claim("b")])
    assert first.error == "prepare dynamic resources: NodePrepareResources skipped 1 ResourceClaims"
    assert first.missing == ("b",)
    assert first.result("a").ok and first.result("a").devices
    assert kubelet.dra.checkpoint.prepared_uids() == set(), "nothing is prepared until all are"

    plugin.omit.clear()
    second = await kubelet.dra.prepare([claim("a"), claim("b")])
    assert second.ok, second.error
    assert [uids for _, uids in plugin.calls] == [("a", "b"), ("a", "b")]
    assert kubelet.dra.checkpoint.prepared_uids() == {"a", "b"}


async def test_a_per_claim_error_fails_the_pod_and_names_the_claim(dra_node):
    kubelet = await dra_node("1.34")
    plugin = await dra_node.plugin(devices={"a": (FPGA0,)},
                                   claim_errors={"b": "claim not allocated to this node"})
    await registered(kubelet, plugin)
    outcome = await kubelet.dra.prepare([claim("a"), claim("b")])
    assert outcome.error == ("prepare dynamic resources: NodePrepareResources failed for "
                             "ResourceClaim claim-b: claim not allocated to this node")
    assert outcome.result("b").error == "claim not allocated to this node"
    assert outcome.result("a").ok


async def test_an_rpc_error_discards_the_whole_answer(dra_node):
    kubelet = await dra_node("1.34")
    plugin = await dra_node.plugin(devices={"a": (FPGA0,)}, abort=grpc.StatusCode.INTERNAL)
    await registered(kubelet, plugin)
    outcome = await kubelet.dra.prepare([claim("a")])
    assert outcome.error == ("prepare dynamic resources: NodePrepareResources: rpc error: "
                             "code = Internal desc = fake driver refuses the call")
    assert not outcome.result("a").answered and outcome.calls[0].error
    plugin.abort = None
    assert (await kubelet.dra.prepare([claim("a")])).ok


async def test_a_claim_replaced_under_the_same_name_is_refused(dra_node):
    kubelet = await dra_node("1.34")
    plugin = await dra_node.plugin(devices={"old": (FPGA0,)})
    await registered(kubelet, plugin)
    assert (await kubelet.dra.prepare([claim("old", "c")])).ok
    outcome = await kubelet.dra.prepare([claim("new", "c")])
    assert outcome.error == ("prepare dynamic resources: old ResourceClaim with same name c and "
                             "different UID old still exists (previous pod force-deleted?!)")
    assert len(plugin.calls) == 1


# -- health ---------------------------------------------------------------------------------------

def health(device, state, **extra):
    return {"device": {"pool_name": "node-1", "device_name": device}, "health": state,
            "last_updated_time": 1700000000, **extra}


@pytest.mark.parametrize(("model", "timeout", "message"), [("1.36", 30, "over temperature"),
                                                           ("1.35", 30, None)])
async def test_health_is_streamed_and_reopened_after_it_ends(dra_node, model, timeout, message):
    knobs = {} if model == "1.36" else {"resource_health": True}
    kubelet = await dra_node(model, **knobs)
    plugin = await dra_node.plugin()
    await registered(kubelet, plugin)
    await kubelet.wait_until(lambda: plugin.health_streams == 1, what="health stream")
    plugin.send_health(health("fpga-0", 1), health("fpga-1", 2, health_check_timeout_seconds=30,
                                                   message="over temperature"))
    dra = kubelet.dra
    await dra.wait_until(lambda: dra.health_updates, what="a health message")
    seen = dra.health(DRIVER)
    assert seen[("node-1", "fpga-0")].health == "Healthy"
    unhealthy = seen[("node-1", "fpga-1")]
    assert (unhealthy.health, unhealthy.timeout_seconds, unhealthy.message) == (
        "Unhealthy", timeout, message)

    plugin.end_health_stream()
    await dra.wait_until(lambda: dra.health_attempts, what="the stream's end")
    assert dra.health_attempts[0].ended == "EOF" and dra.health(DRIVER) == {}
    await dra.wait_until(lambda: plugin.health_streams == 2, what="the stream reopened")


async def test_a_plugin_without_health_gets_unimplemented_retries_and_still_works(dra_node):
    kubelet = await dra_node("1.36")
    plugin = await dra_node.plugin(health=False, devices={"a": (FPGA0,)})
    await registered(kubelet, plugin)
    dra = kubelet.dra
    await dra.wait_until(lambda: len(dra.health_attempts) >= 2, what="two health attempts")
    assert {a.code for a in dra.health_attempts} == {"UNIMPLEMENTED"}
    assert dra.endpoints(DRIVER) and (await dra.prepare([claim("a")])).ok


@pytest.mark.parametrize("model", ["1.33", "1.34"])
async def test_no_health_stream_where_the_gate_is_off(dra_node, model):
    kubelet = await dra_node(model, enabled=True)
    plugin = await dra_node.plugin()
    await registered(kubelet, plugin)
    await asyncio.sleep(0.3)
    assert plugin.health_streams == 0 and kubelet.dra.health_attempts == []


# -- slices and restarts --------------------------------------------------------------------------

async def test_slices_are_wiped_at_start_and_the_wipe_is_retried(dra_node):
    calls: list[str] = []

    async def wipe(node_name):
        calls.append(node_name)
        if len(calls) == 1:
            raise WipeFailed("connection refused")

    kubelet = await dra_node("1.34", node_name="fpga-node", wipe_slices=wipe)
    await kubelet.dra.wait_until(lambda: any(w.ok for w in kubelet.dra.slice_wipes),
                                 what="a successful wipe")
    assert [(w.node, w.driver, w.ok, w.attempt) for w in kubelet.dra.slice_wipes] == [
        ("fpga-node", None, False, 1), ("fpga-node", None, True, 2)]


async def test_a_restarted_kubelet_wipes_again_finds_the_socket_and_keeps_its_checkpoint(
        sockdir, plugins_registry, dra_node):
    wipes: list[str] = []

    async def wipe(node_name):
        wipes.append(node_name)

    config = DraConfig(**FAST_DRA, wipe_slices=wipe)
    first = await dra_node("1.34", config=config)
    plugin = await dra_node.plugin(devices={"a": (FPGA0,)})
    await registered(first, plugin)
    assert (await first.dra.prepare([claim("a")])).ok
    await first.stop()
    assert first.dra is None

    second = await dra_node("1.34", config=config)
    assert await registered(second, plugin, 2) == (True, "")
    await second.dra.wait_until(lambda: len(wipes) == 2, what="the second start's wipe")
    assert plugin.info_calls == 2
    assert (await second.dra.prepare([claim("a")])).result("a").skipped
    assert (await second.dra.unprepare([claim("a")])).ok
    assert [path.rsplit("/", 1)[1] for path, _ in plugin.calls] == [
        "NodePrepareResources", "NodeUnprepareResources"]


class _ApiServer(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list[tuple[str, str]]] = []

    def do_DELETE(self):
        type(self).seen.append(("DELETE", self.path))
        body = b'{"kind":"ResourceSliceList","items":[]}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def apiserver():
    _ApiServer.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ApiServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", _ApiServer.seen
    server.shutdown()
    server.server_close()


async def test_http_wiper_sends_the_kubelets_delete_collection(apiserver):
    url, seen = apiserver
    await http_wiper(url)("node-1")
    assert seen == [("DELETE", "/apis/resource.k8s.io/v1/resourceslices"
                               "?fieldSelector=spec.nodeName%3Dnode-1")]
    assert delete_collection_url(url, "n", "d.example.com").endswith(
        "fieldSelector=spec.nodeName%3Dn%2Cspec.driver%3Dd.example.com")
    with pytest.raises(WipeFailed):
        await http_wiper("http://127.0.0.1:9")("node-1")


async def test_cli_runs_a_dra_kubelet_that_wipes_slices_and_registers_a_driver(
        sockdir, plugins_registry, apiserver):
    url, seen = apiserver
    process = subprocess.Popen(
        [sys.executable, "-m", "compat_tests.kubelet", "--dir", str(sockdir), "--model", "1.34",
         "--plugins-registry", str(plugins_registry), "--reconcile-period", "0.1",
         "--apiserver", url, "--node-name", "n1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        plugin = await FakeDraPlugin(plugins_registry).start()
        try:
            for _ in range(100):
                if plugin.statuses and seen:
                    break
                await asyncio.sleep(0.1)
        finally:
            await plugin.stop()
        assert plugin.statuses[:1] == [(True, "")]
        assert seen[:1] == [("DELETE", "/apis/resource.k8s.io/v1/resourceslices"
                                       "?fieldSelector=spec.nodeName%3Dn1")]
    finally:
        os.kill(process.pid, signal.SIGINT)
        output, _ = process.communicate(timeout=10)
    assert process.returncode == 0, output
    assert f"registered DRA driver {DRIVER}" in output and "v1.DRAPlugin" in output
    assert "deleted ResourceSlices of node n1" in output


def test_dra_on_a_kubelet_too_old_for_it_is_refused(sockdir):
    with pytest.raises(ValueError, match="no DRA"):
        KubeletEmulator(sockdir, "1.30", dra=DraConfig(enabled=True))
