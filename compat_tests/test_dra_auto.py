"""``serve --api auto``: one node moved between the device plugin and DRA under one process.

The node's kubelet is upgraded 1.33 -> 1.36 and downgraded back while the real ``serve`` keeps
running, against an emulated 1.36 API server with a DeviceClass that maps
``b-com.com/accelerator``: the 1.33 kubelet (DRA gate off) refuses the DRA driver and gets the
device plugin; the 1.36 kubelet registers the driver and gets ResourceSlices. Polled all the
way through: the node never offers the resource both ways (a device-plugin registration with
devices and published slices at the same moment), and the time it offers neither is the
decision alone. Also: no DeviceClass mapping the name, or an API server without
resource.k8s.io, keeps the device plugin even under a DRA-capable kubelet.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from compat_tests.apiserver import ApiServerEmulator
from compat_tests.conftest import FAST_DRA
from compat_tests.dra_support import until, wiper
from compat_tests.fake_sysfs import FakeNode
from compat_tests.kubelet import KubeletEmulator
from compat_tests.kubelet.dra import DraConfig
from compat_tests.kubelet.dra_results import ClaimRef
from compat_tests.plugin_process import PluginProcess

NODE = "node-a"
DRIVER = "accelerator.b-com.com"
RESOURCE = "b-com.com/accelerator"
SETTLE = 15.0


class Node:
    """The node under test: its kubelet (replaced at each upgrade), API server, plugin."""

    def __init__(self, sockdir: Path, registry: Path, api: ApiServerEmulator) -> None:
        self.sockdir = sockdir
        self.registry = registry
        self.api = api
        self.config = DraConfig(**FAST_DRA, node_name=NODE, wipe_slices=wiper(api))
        self.kubelet: KubeletEmulator | None = None
        self.both_seen = 0
        self.samples = 0

    async def boot(self, model: str) -> KubeletEmulator:
        if self.kubelet is not None:
            await self.kubelet.stop()
        self.kubelet = KubeletEmulator(self.sockdir, model, plugins_registry=self.registry,
                                       reconcile_period=0.05, dra=self.config)
        await self.kubelet.start()
        return self.kubelet

    def device_plugin_offers(self) -> bool:
        kubelet = self.kubelet
        return kubelet is not None and kubelet.is_connected(RESOURCE) and any(
            d.healthy for d in kubelet.devices(RESOURCE).values())

    def dra_offers(self) -> bool:
        return any(s["spec"]["nodeName"] == NODE and s["spec"].get("devices")
                   for s in self.api.list("resourceslices"))

    async def watch_both(self) -> None:
        """Sample the node every 5 ms: count moments it offers the name both ways."""
        while True:
            self.samples += 1
            if self.device_plugin_offers() and self.dra_offers():
                self.both_seen += 1
            await asyncio.sleep(0.005)


def start_plugin(sockdir: Path, logdir: Path, registry: Path, fake: FakeNode,
                 kubeconfig: Path, tmp_path: Path, *extra: str) -> PluginProcess:
    return PluginProcess(sockdir, logdir, extra=[
        "--api", "auto", "--node-name", NODE, "--kubeconfig", str(kubeconfig),
        "--plugins-registry-dir", str(registry), "--dra-state-dir", str(sockdir / "state"),
        "--cdi-spec-dir", str(tmp_path / "cdi"), "--backend", "intel",
        "--sysfs-root", str(fake.sysfs_root), "--dev-root", str(fake.dev_root),
        "--watcher-wait", "2", *extra]).start()


@pytest.fixture
async def cluster(sockdir: Path, tmp_path: Path) -> AsyncIterator[tuple[ApiServerEmulator, Path]]:
    registry = sockdir / "registry"
    registry.mkdir()
    async with ApiServerEmulator("1.36") as api:
        api.create_node(NODE)
        api.create_namespace("default")
        yield api, registry


def fake_node(tmp_path: Path) -> FakeNode:
    fake = FakeNode(tmp_path / "node")
    fake.add_dfl_card("0000:3b:00.0", ports=2)
    return fake


@contextlib.asynccontextmanager
async def mapped_node(cluster: tuple[ApiServerEmulator, Path], sockdir: Path, logdir: Path,
                      tmp_path: Path, model: str,
                      *extra: str) -> AsyncIterator[tuple[Node, PluginProcess, FakeNode]]:
    """A node whose kubelet runs ``model``, a DeviceClass mapping the name, and the real
    ``serve --api auto`` (started after the kubelet); both stopped at the end."""
    api, registry = cluster
    api.create_device_class(DRIVER, driver=DRIVER, extended_resource_name=RESOURCE)
    node = Node(sockdir, registry, api)
    fake = fake_node(tmp_path)
    await node.boot(model)
    plugin = start_plugin(sockdir, logdir, registry, fake,
                          api.write_kubeconfig(tmp_path / "kc"), tmp_path, *extra)
    try:
        yield node, plugin, fake
    finally:
        assert node.kubelet is not None
        await node.kubelet.stop()
        plugin.kill()


def choices(plugin: PluginProcess) -> list[tuple[str, str]]:
    """Each choice of API the plugin logged, in order: (the API, why)."""
    said = [e.get("message", "") for e in plugin.entries()]
    return [(through.removeprefix("serving its devices through "), why)
            for _, through, why in (m.split(": ", 2) for m in said
                                    if "serving its devices through" in m)]


async def test_a_node_upgraded_and_downgraded_under_one_plugin(cluster, sockdir, logdir,
                                                                tmp_path):
    api, _ = cluster
    async with mapped_node(cluster, sockdir, logdir, tmp_path, "1.33") as (node, plugin, _):
        watcher = asyncio.create_task(node.watch_both())
        try:
            await until(node.device_plugin_offers, "1.33: the device plugin")
            assert not node.dra_offers()

            kubelet = await node.boot("1.36")
            await until(node.dra_offers, "1.36: DRA slices")
            await until(lambda: not node.device_plugin_offers(), "1.36: no device plugin")
            assert kubelet.register_calls == 0, \
                "a kubelet that gets DRA never sees a device-plugin registration first"
            assert kubelet.dra is not None
            await kubelet.dra.wait_until(lambda: kubelet.dra.endpoints(DRIVER), SETTLE,
                                         "driver")
            claim = api.create_allocated_claim("default", "c", driver=DRIVER, pool=NODE,
                                               devices=["pci-0000-3b-00-0"], node_name=NODE)
            outcome = await kubelet.dra.prepare([ClaimRef("default", "c",
                                                          claim["metadata"]["uid"],
                                                          (DRIVER,))])
            assert outcome.ok, outcome.error

            await node.boot("1.33")
            await until(node.device_plugin_offers, "1.33 again: the device plugin")
            await until(lambda: not node.dra_offers(), "1.33 again: slices withdrawn")
            assert plugin.alive
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
    assert node.samples > 100
    assert node.both_seen == 0, f"offered both ways in {node.both_seen} of {node.samples} samples"
    said = choices(plugin)
    assert [api for api, _ in said] == ["the device plugin", "DRA", "the device plugin"], said
    assert "no handler registered for plugin type: DRAPlugin" in said[0][1]


async def test_a_kubelet_start_is_decided_once_and_stays_decided(cluster, sockdir, logdir,
                                                               tmp_path):
    """A kubelet start removes ``kubelet.sock`` and creates it again; the new kubelet may
    register the DRA driver in between. The node must then stay on DRA: a second decision
    for the same kubelet, waiting for a registration that already came, would move it to the
    device plugin after ``--watcher-wait``, withdrawing its slices from a DRA kubelet."""
    async with mapped_node(cluster, sockdir, logdir, tmp_path, "1.33") as (node, plugin, _):
        await until(node.device_plugin_offers, "1.33: the device plugin")
        await node.boot("1.36")
        await until(node.dra_offers, "1.36: DRA slices")
        await asyncio.sleep(2 + 1.5)  # --watcher-wait, and then some
        assert node.dra_offers() and not node.device_plugin_offers()
    said = choices(plugin)
    assert [api for api, _ in said] == ["the device plugin", "DRA"], said


async def test_a_kubelet_down_for_a_while_leaves_the_node_as_it_was(cluster, sockdir, logdir,
                                                                   tmp_path):
    """With no kubelet there is nothing to decide for: a node on DRA keeps its slices while
    its kubelet is down (the next kubelet start deletes and gets them again), instead of
    moving to the device plugin and back."""
    async with mapped_node(cluster, sockdir, logdir, tmp_path, "1.36") as (node, plugin, _):
        await until(node.dra_offers, "DRA slices")
        assert node.kubelet is not None
        await node.kubelet.stop()
        await asyncio.sleep(2 + 1.5)  # past --watcher-wait
        assert node.dra_offers(), "the slices stay while no kubelet runs"
        await node.boot("1.36")
        await until(node.dra_offers, "DRA slices under the new kubelet")
        await asyncio.sleep(2 + 1.5)
        assert node.dra_offers() and not node.device_plugin_offers()
    said = choices(plugin)
    assert [api for api, _ in said] == ["DRA"], said


@pytest.mark.parametrize("why", ["no class", "no resource api"])
async def test_dra_needs_the_api_server_and_a_device_class(cluster, sockdir, logdir, tmp_path,
                                                           start_api, why):
    api, registry = cluster
    if why == "no resource api":
        api, _ = await start_api("1.33")  # resource.k8s.io not served by default
        api.create_node(NODE)
    node = Node(sockdir, registry, api)
    fake = fake_node(tmp_path)
    await node.boot("1.36")
    plugin = start_plugin(sockdir, logdir, registry, fake,
                          api.write_kubeconfig(tmp_path / "kc"), tmp_path)
    try:
        await until(node.device_plugin_offers, "the device plugin")
        assert not node.dra_offers()
    finally:
        await node.kubelet.stop()
        plugin.kill()
    (api_chosen, reason), *_ = choices(plugin)
    assert api_chosen == "the device plugin"
    assert ("no DeviceClass maps" if why == "no class" else "resource.k8s.io") in reason


class Scraper:
    """The plugin's /metrics, read as Prometheus would."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/metrics"

    @staticmethod
    def free_port() -> int:
        """A port nothing listens on now (``--metrics-port`` takes no 0)."""
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            return int(probe.getsockname()[1])

    @classmethod
    async def of(cls, plugin: PluginProcess) -> Scraper:
        entry = await plugin.wait_for_log(lambda e: "metrics on http" in e.get("message", ""),
                                          what="the metrics address")
        port = re.search(r":(\d+)/metrics", entry["message"])
        assert port is not None, entry
        return cls(int(port.group(1)))

    def samples(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        body = urllib.request.urlopen(self.url, timeout=5).read().decode()
        return {(s.name, frozenset(s.labels.items())): s.value
                for family in text_string_to_metric_families(body) for s in family.samples}

    async def until(self, what: str, **expected: float) -> dict:
        """Scrape until every sample named in ``expected`` has its value (names as
        :func:`key` reads them, such as ``"node_api__api=dra"``); the last samples scraped."""
        last: dict = {}

        def holds() -> bool:
            nonlocal last
            last = self.samples()
            return all(last.get(key(name)) == value for name, value in expected.items())

        try:
            await until(holds, what, SETTLE)
        except AssertionError as error:
            seen = {k: v for k, v in last.items() if "dra" in k[0] or "node_api" in k[0]}
            raise AssertionError(f"{error}; scraped {seen}") from None
        return last


def key(spec: str) -> tuple[str, frozenset[tuple[str, str]]]:
    """``dra_claims_total__operation=prepare,result=ok`` -> the sample's key."""
    name, _, labels = spec.partition("__")
    pairs = dict(part.split("=") for part in labels.split(",") if part)
    if name.startswith("dra_"):
        pairs.setdefault("driver", DRIVER)
    return f"accelerator_device_plugin_{name}", frozenset(pairs.items())


async def test_metrics_follow_the_node_through_an_upgrade_and_back(cluster, sockdir, logdir,
                                                                   tmp_path):
    """What an operator moving a fleet watches: which API each node serves, whether its
    slices are written, what became of the kubelet's claims."""
    api, _ = cluster
    async with mapped_node(cluster, sockdir, logdir, tmp_path, "1.33",
                           "--metrics-port", str(Scraper.free_port()),
                           "--metrics-address", "127.0.0.1") as (node, plugin, fake):
        metrics = await Scraper.of(plugin)
        scraped = await metrics.until("1.33: the device plugin", **{
            "node_api__api=device-plugin": 1, "node_api__api=dra": 0})
        assert key("dra_slices_in_sync") not in scraped, "no DRA figure on a device-plugin node"

        kubelet = await node.boot("1.36")
        await metrics.until("1.36: DRA, slices written", **{
            "node_api__api=device-plugin": 0, "node_api__api=dra": 1,
            "dra_slices_in_sync": 1, "dra_prepared_claims": 0})
        assert metrics.samples()[key("dra_slice_publications_total")] >= 1
        assert kubelet.dra is not None
        await kubelet.dra.wait_until(lambda: kubelet.dra.endpoints(DRIVER), SETTLE, "driver")
        good = api.create_allocated_claim("default", "good", driver=DRIVER, pool=NODE,
                                          devices=["pci-0000-3b-00-0"], node_name=NODE)
        unknown = api.create_allocated_claim("default", "unknown", driver=DRIVER, pool=NODE,
                                             devices=["pci-0000-99-00-0"], node_name=NODE)
        refs = [ClaimRef("default", c["metadata"]["name"], c["metadata"]["uid"], (DRIVER,))
                for c in (good, unknown)]
        outcome = await kubelet.dra.prepare(refs)
        assert outcome.result(refs[0].uid).ok and not outcome.result(refs[1].uid).ok
        await metrics.until("one claim prepared, one refused", **{
            "dra_claims_total__operation=prepare,result=ok": 1,
            "dra_claims_total__operation=prepare,result=error": 1,
            "dra_prepared_claims": 1})

        await api.go_down()
        fake.add_dfl_card("0000:5e:00.0")  # a change to publish while the server is away
        await metrics.until("slices out of sync in the outage", dra_slices_in_sync=0)
        await api.come_back()
        await metrics.until("slices written again", dra_slices_in_sync=1)

        outcome = await kubelet.dra.unprepare(refs[:1])
        assert outcome.ok, outcome.error
        await metrics.until("the claim unprepared", **{
            "dra_claims_total__operation=unprepare,result=ok": 1, "dra_prepared_claims": 0})

        await node.boot("1.33")
        scraped = await metrics.until("1.33 again: the device plugin", **{
            "node_api__api=device-plugin": 1, "node_api__api=dra": 0})
        assert key("dra_slices_in_sync") not in scraped, "the DRA figure goes with DRA"
