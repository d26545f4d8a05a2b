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
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from compat_tests.apiserver import ApiServerEmulator
from compat_tests.conftest import FAST_DRA
from compat_tests.dra_support import until, wiper
from compat_tests.kubelet import KubeletEmulator
from compat_tests.kubelet.dra import DraConfig
from compat_tests.kubelet.dra_results import ClaimRef
from compat_tests.plugin_process import PluginProcess
from plugin.discovery.backends.fake_sysfs import FakeNode

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
                 kubeconfig: Path, tmp_path: Path) -> PluginProcess:
    return PluginProcess(sockdir, logdir, extra=[
        "--api", "auto", "--node-name", NODE, "--kubeconfig", str(kubeconfig),
        "--plugins-registry-dir", str(registry), "--dra-state-dir", str(sockdir / "state"),
        "--cdi-spec-dir", str(tmp_path / "cdi"), "--backend", "intel",
        "--sysfs-root", str(fake.sysfs_root), "--dev-root", str(fake.dev_root),
        "--watcher-wait", "2"]).start()


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


async def test_a_node_upgraded_and_downgraded_under_one_plugin(cluster, sockdir, logdir,
                                                                tmp_path):
    api, registry = cluster
    api.create_device_class(DRIVER, driver=DRIVER, extended_resource_name=RESOURCE)
    node = Node(sockdir, registry, api)
    fake = fake_node(tmp_path)
    await node.boot("1.33")
    plugin = start_plugin(sockdir, logdir, registry, fake,
                          api.write_kubeconfig(tmp_path / "kc"), tmp_path)
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
        await kubelet.dra.wait_until(lambda: kubelet.dra.endpoints(DRIVER), SETTLE, "driver")
        claim = api.create_allocated_claim("default", "c", driver=DRIVER, pool=NODE,
                                           devices=["pci-0000-3b-00-0"], node_name=NODE)
        outcome = await kubelet.dra.prepare([ClaimRef("default", "c",
                                                      claim["metadata"]["uid"], (DRIVER,))])
        assert outcome.ok, outcome.error

        await node.boot("1.33")
        await until(node.device_plugin_offers, "1.33 again: the device plugin")
        await until(lambda: not node.dra_offers(), "1.33 again: slices withdrawn")
        assert plugin.alive
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        await node.kubelet.stop()
        plugin.kill()
    assert node.samples > 100
    assert node.both_seen == 0, f"offered both ways in {node.both_seen} of {node.samples} samples"
    said = [e.get("message", "") for e in plugin.entries()]
    choices = [m for m in said if "serving its devices through" in m]
    assert [("DRA" in m.split(":")[1]) for m in choices] == [False, True, False], choices
    assert "no handler registered for plugin type: DRAPlugin" in choices[0]


async def test_a_kubelet_start_is_decided_once_and_stays_decided(cluster, sockdir, logdir,
                                                               tmp_path):
    """A kubelet start removes ``kubelet.sock`` and creates it again; the new kubelet may
    register the DRA driver in between. The node must then stay on DRA: a second decision
    for the same kubelet, waiting for a registration that already came, would move it to the
    device plugin after ``--watcher-wait``, withdrawing its slices from a DRA kubelet."""
    api, registry = cluster
    api.create_device_class(DRIVER, driver=DRIVER, extended_resource_name=RESOURCE)
    node = Node(sockdir, registry, api)
    fake = fake_node(tmp_path)
    await node.boot("1.33")
    plugin = start_plugin(sockdir, logdir, registry, fake,
                          api.write_kubeconfig(tmp_path / "kc"), tmp_path)
    try:
        await until(node.device_plugin_offers, "1.33: the device plugin")
        await node.boot("1.36")
        await until(node.dra_offers, "1.36: DRA slices")
        await asyncio.sleep(2 + 1.5)  # --watcher-wait, and then some
        assert node.dra_offers() and not node.device_plugin_offers()
    finally:
        await node.kubelet.stop()
        plugin.kill()
    said = [e.get("message", "") for e in plugin.entries()]
    choices = [m.split(":")[1].strip() for m in said if "serving its devices through" in m]
    assert choices == ["serving its devices through the device plugin",
                       "serving its devices through DRA"], choices


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
    choice = next(e["message"] for e in plugin.entries()
                  if "serving its devices through" in e.get("message", ""))
    assert ("no DeviceClass maps" if why == "no class" else "resource.k8s.io") in choice

