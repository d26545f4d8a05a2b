"""Kubernetes Events from the real ``serve``: what ``kubectl describe node`` would show.

Against an emulated 1.36 API server (every Event held to the 1.36 schema and rules of
events.k8s.io/v1) and an emulated 1.36 kubelet: a crashed AFU is one Warning on the Node with
the reason discovery gave, its healing one Normal; a flapping port is two Events whose series
count the flaps, within the spam filter's burst; a move from the device plugin to DRA is an
Event; Events refused (403) or hanging leave serving alone (slices published, a claim
prepared while an Event's POST hangs) with one warning; ``--events off`` writes none.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from compat_tests.apiserver import ApiServerEmulator
from compat_tests.conftest import FAST_DRA
from compat_tests.dra_support import until, wiper
from compat_tests.fake_sysfs import CRASHED_AFU_ID, DEFAULT_AFU_ID, FakeNode
from compat_tests.kubelet import KubeletEmulator
from compat_tests.kubelet.dra import DraConfig
from compat_tests.kubelet.dra_results import ClaimRef
from compat_tests.plugin_process import PluginProcess
from compat_tests.test_dra_auto import cluster, mapped_node  # noqa: F401 (a fixture)
from plugin.discovery.backends.intel import AFU_CRASHED
from plugin.process import events

NODE = "node-a"
DRIVER = "accelerator.b-com.com"
SETTLE = 15.0
CRASHED_DEVICE = "0000:5e:00.0"


@dataclass
class Bench:
    api: ApiServerEmulator
    kubelet: KubeletEmulator
    fake: FakeNode
    ports: dict[str, list[str]]
    sockdir: Path
    logdir: Path
    registry: Path
    kubeconfig: Path
    tmp_path: Path
    plugin: PluginProcess | None = None

    def start(self, *extra: str) -> PluginProcess:
        self.plugin = PluginProcess(self.sockdir, self.logdir, extra=[
            "--api", "dra", "--node-name", NODE, "--kubeconfig", str(self.kubeconfig),
            "--plugins-registry-dir", str(self.registry),
            "--dra-state-dir", str(self.sockdir / "state"),
            "--cdi-spec-dir", str(self.tmp_path / "cdi"), "--backend", "intel",
            "--sysfs-root", str(self.fake.sysfs_root), "--dev-root", str(self.fake.dev_root),
            "--health-interval", "0.05", *extra]).start()
        return self.plugin

    def events(self, reason: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.api.list("events", "default")
                if reason in (None, e["reason"])]

    def event_writes(self) -> int:
        return len([r for r in self.api.requests if r.resource == "events"
                    and r.verb in ("create", "patch")])

    def slices_published(self) -> bool:
        return any(s["spec"]["nodeName"] == NODE and s["spec"].get("devices")
                   for s in self.api.list("resourceslices"))

    def tainted(self) -> bool:
        return any(d.get("taints") for s in self.api.list("resourceslices")
                   for d in s["spec"].get("devices", []))

    def warnings_about_events(self) -> list[str]:
        assert self.plugin is not None
        return [e["message"] for e in self.plugin.entries()
                if e.get("level") == "warning" and "Kubernetes Event" in e.get("message", "")]

    async def ready(self) -> None:
        await until(self.slices_published, "the pool published", SETTLE)
        assert self.kubelet.dra is not None
        await self.kubelet.dra.wait_until(lambda: self.kubelet.dra.endpoints(DRIVER), SETTLE,
                                          "driver registered")

    def crash(self) -> None:
        self.fake.set_afu_id(self.ports["5e"][0], CRASHED_AFU_ID)

    def heal(self) -> None:
        self.fake.set_afu_id(self.ports["5e"][0], DEFAULT_AFU_ID)


@pytest.fixture
async def bench(sockdir: Path, logdir: Path, tmp_path: Path) -> AsyncIterator[Bench]:
    fake = FakeNode(tmp_path / "node")
    ports = {bus: fake.add_dfl_card(f"0000:{bus}:00.0", ports=1) for bus in ("3b", "5e")}
    registry = sockdir / "registry"
    registry.mkdir()
    async with ApiServerEmulator("1.36") as api:
        api.create_node(NODE)
        config = DraConfig(**FAST_DRA, node_name=NODE, wipe_slices=wiper(api))
        kubelet = KubeletEmulator(sockdir, "1.36", plugins_registry=registry,
                                  reconcile_period=0.05, dra=config)
        await kubelet.start()
        state = Bench(api, kubelet, fake, ports, sockdir, logdir, registry,
                      api.write_kubeconfig(tmp_path / "kubeconfig"), tmp_path)
        try:
            yield state
        finally:
            if state.plugin is not None:
                state.plugin.kill()
            await state.kubelet.stop()


def logged(plugin: PluginProcess, text: str) -> Callable[[], int]:
    return lambda: sum(text in e.get("message", "") for e in plugin.entries())


async def test_a_crashed_afu_is_one_warning_on_the_node_and_healing_one_normal(bench):
    bench.start()
    await bench.ready()
    node_uid = bench.api.get("nodes", NODE)["metadata"]["uid"]
    bench.crash()
    await until(lambda: bench.events("DeviceUnhealthy"), "a DeviceUnhealthy Event", SETTLE)
    [warning] = bench.events("DeviceUnhealthy")
    assert warning["type"] == "Warning"
    assert warning["regarding"] == {"apiVersion": "v1", "kind": "Node", "name": NODE,
                                    "uid": node_uid}
    assert CRASHED_DEVICE in warning["note"] and AFU_CRASHED in warning["note"]
    assert "b-com.com/accelerator" in warning["note"]
    assert warning["reportingController"] == "b-com.com/accelerator-device-plugin"
    bench.heal()
    await until(lambda: bench.events("DeviceHealthy"), "a DeviceHealthy Event", SETTLE)
    [normal] = bench.events("DeviceHealthy")
    assert normal["type"] == "Normal" and CRASHED_DEVICE in normal["note"]
    assert len(bench.events()) == 2
    assert bench.api.events.refusals == [], "every Event met the 1.36 schema and rules"


async def test_a_flapping_port_is_two_events_counting_the_flaps_within_the_burst(bench):
    plugin = bench.start()
    await bench.ready()
    unhealthy = logged(plugin, f"device {CRASHED_DEVICE} is unhealthy")
    healthy = logged(plugin, f"device {CRASHED_DEVICE} is healthy again")
    flaps = 13  # 26 changes: one more than the spam filter's burst
    for n in range(1, flaps + 1):
        bench.crash()
        await until(lambda n=n: unhealthy() == n, f"crash {n} seen", SETTLE)
        bench.heal()
        await until(lambda n=n: healthy() == n, f"heal {n} seen", SETTLE)
    assert 2 * flaps == events.SPAM_BURST + 1
    await until(lambda: bench.event_writes() >= events.SPAM_BURST, "the burst written", SETTLE)
    await asyncio.sleep(1.0)  # what the filter let through is written by now; nothing more is
    assert bench.event_writes() == events.SPAM_BURST, "the 26th change is held back"
    [down] = bench.events("DeviceUnhealthy")
    [up] = bench.events("DeviceHealthy")
    assert down["series"]["count"] == flaps
    assert up["series"]["count"] == flaps - 1, "its last count waits for the series to end"
    assert bench.api.events.refusals == []
    assert plugin.alive


async def test_events_refused_403_serving_goes_on_with_one_warning(bench):
    bench.api.faults.deny("create", "events")
    bench.api.faults.deny("patch", "events")
    plugin = bench.start()
    await bench.ready()
    for _ in range(3):
        bench.crash()
        await until(bench.tainted, "the crash tainted in the slices", SETTLE)
        bench.heal()
        await until(lambda: not bench.tainted(), "the heal untainted", SETTLE)
    await until(lambda: len(bench.api.find_requests(resource="events", status=403)) >= 2,
                "Events refused", SETTLE)
    claim = bench.api.create_allocated_claim("default", "c", driver=DRIVER, pool=NODE,
                                             devices=["pci-0000-3b-00-0"], node_name=NODE)
    outcome = await bench.kubelet.dra.prepare(
        [ClaimRef("default", "c", claim["metadata"]["uid"], (DRIVER,))])
    assert outcome.ok, outcome.error
    assert bench.events() == []
    [warning] = bench.warnings_about_events()
    assert "403" in warning and "serving goes on" in warning
    assert plugin.alive


async def test_events_hanging_a_claim_still_prepares_with_one_warning(bench):
    """The Event's POST hangs until the client gives it up after --api-request-timeout (10 s
    by default), which is what logs the warning: a claim prepared, and the crash tainted in
    the slices, before that warning were so while the POST hung."""
    bench.api.faults.slow_down("*", "events", 3600)
    plugin = bench.start()
    await bench.ready()
    bench.crash()
    await until(lambda: bench.api.find_requests(verb="create", resource="events"),
                "an Event's POST under way", SETTLE)
    claim = bench.api.create_allocated_claim("default", "c", driver=DRIVER, pool=NODE,
                                             devices=["pci-0000-3b-00-0"], node_name=NODE)
    outcome = await bench.kubelet.dra.prepare(
        [ClaimRef("default", "c", claim["metadata"]["uid"], (DRIVER,))])
    assert outcome.ok, outcome.error
    await until(bench.tainted, "the crash tainted in the slices", SETTLE)
    assert bench.warnings_about_events() == [], \
        "the claim was prepared and the crash published while the Event's POST hung"
    await until(lambda: bench.warnings_about_events(), "the timeout said", 30)
    await until(lambda: len(bench.api.find_requests(verb="create", resource="events")) >= 2,
                "retried with back-off", 30)
    [warning] = bench.warnings_about_events()
    assert "in time" in warning
    assert plugin.alive


async def test_events_off_writes_none(bench):
    plugin = bench.start("--events", "off")
    await bench.ready()
    bench.crash()
    await until(bench.tainted, "the crash tainted in the slices", SETTLE)
    await until(logged(plugin, "is unhealthy"), "the crash logged", SETTLE)
    await asyncio.sleep(0.5)
    assert bench.api.find_requests(resource="events") == []
    assert bench.events() == []


async def test_a_move_from_the_device_plugin_to_dra_is_an_event(cluster, sockdir,  # noqa: F811
                                                                  logdir, tmp_path):
    api, _ = cluster
    async with mapped_node(cluster, sockdir, logdir, tmp_path, "1.33") as (node, _, _):
        await until(node.device_plugin_offers, "1.33: the device plugin")
        assert [e for e in api.list("events", "default")] == [], "no move yet"
        await node.boot("1.36")
        await until(node.dra_offers, "1.36: DRA slices")
        await until(lambda: api.list("events", "default"), "the move's Event", SETTLE)
        [moved] = api.list("events", "default")
    assert (moved["type"], moved["reason"]) == ("Normal", "ServingAPIChanged")
    assert moved["note"].startswith("Devices are served through DRA instead of the device "
                                    "plugin: the kubelet registered the DRA driver")
    assert moved["regarding"]["name"] == NODE
    assert api.events.refusals == []


async def test_events_on_for_the_device_plugin(kubelet, plugin, tmp_path):
    fake = FakeNode(tmp_path / "node")
    ports = fake.add_dfl_card("0000:5e:00.0", ports=1)
    async with ApiServerEmulator("1.36") as api:
        api.create_node(NODE)
        node_kubelet = await kubelet("1.26")
        serve = plugin(extra=[
            "--events", "on", "--node-name", NODE,
            "--kubeconfig", str(api.write_kubeconfig(tmp_path / "kubeconfig")),
            "--backend", "intel", "--sysfs-root", str(fake.sysfs_root),
            "--dev-root", str(fake.dev_root), "--health-interval", "0.05"])
        await node_kubelet.wait_for_devices("b-com.com/accelerator", timeout=SETTLE)
        fake.set_afu_id(ports[0], CRASHED_AFU_ID)
        await until(lambda: api.list("events", "default"), "a DeviceUnhealthy Event", SETTLE)
        [warning] = api.list("events", "default")
        assert warning["reason"] == "DeviceUnhealthy" and AFU_CRASHED in warning["note"]
        assert api.find_requests(resource="resourceslices") == [], "still no DRA"
        assert serve.alive


async def test_the_sink_against_the_emulated_api_server(tmp_path):
    from plugin.process.events import SinkFailure
    from plugin.serving.events_api import NodeEventSink

    async with ApiServerEmulator("1.36", tls=True) as api:
        node = api.create_node(NODE)
        sink = NodeEventSink(NODE, api.write_kubeconfig(tmp_path / "kubeconfig"), timeout=1.0)
        try:
            assert await sink.uid() == node["metadata"]["uid"]
            correlator = events.Correlator(events.Regarding("Node", NODE),
                                           "b-com.com/accelerator-device-plugin", "i-1")
            write = correlator.correlate(events.Occurrence("Warning", "R", "A", "note"))
            assert write is not None
            await sink.create("default", write.event)
            await sink.create("default", write.event)  # a retried create that had made it
            series = {"count": 2, "lastObservedTime": events.micro_time(0)}
            await sink.patch("default", write.name, {"series": series})
            [stored] = api.list("events", "default")
            assert stored["series"]["count"] == 2
            with pytest.raises(SinkFailure) as gone:
                await sink.patch("default", "node-a.0", {"series": series})
            assert gone.value.not_found
            api.faults.deny("create", "events")
            with pytest.raises(SinkFailure) as refused:
                await sink.create("default", {**write.event, "metadata": {
                    "name": "node-a.1", "namespace": "default"}})
            assert (refused.value.kind, refused.value.retry) == ("HTTP 403", False)
            api.faults.slow_down("*", "events", 30)
            with pytest.raises(SinkFailure) as hung:
                await sink.patch("default", write.name, {"series": series})
            assert (hung.value.kind, hung.value.retry) == ("timeout", True)
            assert api.events.refusals == []
        finally:
            await sink.close()


async def test_events_wait_out_an_api_server_outage(bench):
    plugin = bench.start()
    await bench.ready()
    await bench.api.go_down()
    bench.crash()
    await until(lambda: bench.warnings_about_events(), "the outage said", SETTLE)
    await bench.api.come_back()
    await until(lambda: bench.events("DeviceUnhealthy"), "the Event written after", 30)
    await until(logged(plugin, "Kubernetes Events are written again"), "said", SETTLE)
    [warning] = bench.warnings_about_events()
    assert "unreachable" in warning or "in time" in warning
    assert plugin.alive
