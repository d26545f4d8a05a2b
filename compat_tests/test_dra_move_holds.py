"""``serve --api auto``: a move never hands out a device a running container still holds.

A kubelet upgraded in place (1.33 -> 1.36) does not stop running containers: one that got a
port through the device plugin keeps it, and the 1.36 kubelet's PodResources API lists it at
once (restored from the device manager's checkpoint; the emulated kubelets share it through
their directory). The real ``serve`` must publish that port tainted ``<driver>/in-use`` and
prepare no claim on it until the pod ends, then offer it within about a second. Where the
PodResources socket is missing, refuses or hangs, it offers every device as before and says
so once.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from compat_tests.apiserver import ApiServerEmulator
from compat_tests.dra_support import until
from compat_tests.kubelet import KubeletEmulator
from compat_tests.kubelet.dra_results import ClaimRef
from compat_tests.plugin_process import PluginProcess
from compat_tests.test_dra_auto import (
    DRIVER,
    NODE,
    RESOURCE,
    SETTLE,
    Node,
    Scraper,
    choices,
    cluster,
    fake_node,
    start_plugin,
)
from plugin.serving.dra.inventory import device_name

IN_USE = f"{DRIVER}/in-use"
__all__ = ["cluster"]  # the fixture, shared with test_dra_auto


class HoldingNode(Node):
    """A node whose kubelets serve PodResources on ``pod_resources`` (or not, or hang)."""

    def __init__(self, *args: object, pod_resources: Path | None, hang: bool = False) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.pod_resources = pod_resources
        self.hang = hang

    async def boot(self, model: str) -> KubeletEmulator:
        if self.kubelet is not None:
            await self.kubelet.stop()
        self.kubelet = KubeletEmulator(self.sockdir, model, plugins_registry=self.registry,
                                       reconcile_period=0.05, dra=self.config,
                                       pod_resources_socket=self.pod_resources,
                                       hang_pod_resources=self.hang)
        await self.kubelet.start()
        return self.kubelet

    def slice_devices(self) -> dict[str, list[dict]]:
        """Device name -> its taints, over every published slice of the node."""
        return {d["name"]: d.get("taints", [])
                for s in self.api.list("resourceslices") if s["spec"]["nodeName"] == NODE
                for d in s["spec"].get("devices", [])}


@contextlib.asynccontextmanager
async def holding_node(cluster: tuple[ApiServerEmulator, Path], sockdir: Path, logdir: Path,
                       tmp_path: Path, *, serve_socket: bool = True, hang: bool = False,
                       extra: tuple[str, ...] = (), model: str = "1.33"
                       ) -> AsyncIterator[tuple[HoldingNode, PluginProcess]]:
    api, registry = cluster
    api.create_device_class(DRIVER, driver=DRIVER, extended_resource_name=RESOURCE)
    socket_path = sockdir / "pr" / "kubelet.sock"
    node = HoldingNode(sockdir, registry, api,
                       pod_resources=socket_path if serve_socket else None, hang=hang)
    fake = fake_node(tmp_path)
    await node.boot(model)
    plugin = start_plugin(sockdir, logdir, registry, fake,
                          api.write_kubeconfig(tmp_path / "kc"), tmp_path,
                          "--pod-resources-socket", str(socket_path), *extra)
    try:
        yield node, plugin
    finally:
        assert node.kubelet is not None
        await node.kubelet.stop()
        plugin.kill()


def held_events(api: ApiServerEmulator) -> list[dict]:
    return [e for e in api.list("events", "default") if e["reason"] == "DevicesHeldAcrossMove"]


async def prepare(api: ApiServerEmulator, kubelet: KubeletEmulator, name: str,
                  device: str, pod: str | None = None) -> tuple[bool, str | None]:
    reserved = [{"resource": "pods", "name": pod, "uid": f"uid-{pod}"}] if pod else []
    claim = api.create_allocated_claim("default", name, driver=DRIVER, pool=NODE,
                                       devices=[device], node_name=NODE,
                                       reserved_for=reserved)
    assert kubelet.dra is not None
    outcome = await kubelet.dra.prepare([ClaimRef("default", name, claim["metadata"]["uid"],
                                                  (DRIVER,))])
    return outcome.ok, outcome.error


async def device_plugin_pod(node: HoldingNode) -> tuple[str, str]:
    """A pod that got the first port through the 1.33 kubelet's device plugin: (ID, name)."""
    kubelet = node.kubelet
    assert kubelet is not None
    await until(node.device_plugin_offers, "1.33: the device plugin")
    held = sorted(kubelet.devices(RESOURCE))[0]
    await kubelet.run_pod("default", "old", "main", RESOURCE, [held])
    return held, device_name(held)


async def test_a_device_held_through_the_device_plugin_stays_out_of_dra_until_released(
        cluster, sockdir, logdir, tmp_path):
    api, _ = cluster
    port = Scraper.free_port()
    async with holding_node(cluster, sockdir, logdir, tmp_path, extra=(
            "--metrics-port", str(port), "--metrics-address", "127.0.0.1")) as (node, plugin):
        metrics = await Scraper.of(plugin)
        held_id, held = await device_plugin_pod(node)

        kubelet = await node.boot("1.36")  # the pod keeps running across the upgrade
        await until(lambda: held in node.slice_devices(), "1.36: DRA slices")
        published = node.slice_devices()
        assert [t["key"] for t in published[held]] == [IN_USE], published
        assert published[held][0]["effect"] == "NoSchedule"
        free = [name for name, taints in published.items() if name != held]
        assert free and all(not published[name] for name in free), published
        await metrics.until("one device held through the device plugin",
                            **{"devices_held_by_other_api__api=device-plugin": 1})

        assert kubelet.dra is not None
        await kubelet.dra.wait_until(lambda: kubelet.dra.endpoints(DRIVER), SETTLE, "driver")
        ok, error = await prepare(api, kubelet, "new", held)
        assert not ok and "in use through the device plugin" in (error or ""), error
        assert "default/old" in (error or ""), error
        ok, error = await prepare(api, kubelet, "other", free[0])
        assert ok, error

        await until(lambda: held_events(api), "a DevicesHeldAcrossMove Event")

        kubelet.end_pod("default", "old")
        released = await until(lambda: not node.slice_devices().get(held, [True]),
                               "the released device offered untainted")
        ok, error = await prepare(api, kubelet, "after", held)
        assert ok, error
        await metrics.until("nothing held", **{"devices_held_by_other_api__api=device-plugin": 0})
    said = [e.get("message", "") for e in plugin.entries()]
    moved = [m for m in said if m.startswith("node moved:")]
    assert len(moved) == 1 and "pod default/old container main" in moved[0], moved
    assert held_id in moved[0]
    [event] = held_events(api)
    assert event["type"] == "Warning" and "pod default/old container main" in event["note"]
    assert event["regarding"]["name"] == NODE
    assert api.events.refusals == [], "the Event met the 1.36 schema and rules"
    assert [api for api, _ in choices(plugin)] == ["the device plugin", "DRA"]
    print(f"held device offered {released:.3f} s after its pod ended")


@pytest.mark.parametrize("fault", ["missing", "refusing", "hanging"])
async def test_an_unreadable_pod_resources_socket_keeps_todays_behaviour(
        cluster, sockdir, logdir, tmp_path, fault):
    """Every device offered as before the plugin asked, and one warning saying why."""
    async with holding_node(cluster, sockdir, logdir, tmp_path,
                            serve_socket=fault == "hanging",
                            hang=fault == "hanging") as (node, plugin):
        if fault == "refusing":  # a socket file nobody listens on (a kubelet killed)
            path = sockdir / "pr" / "kubelet.sock"
            path.parent.mkdir(exist_ok=True)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
                dead.bind(str(path))
        _held_id, held = await device_plugin_pod(node)
        await node.boot("1.36")
        await until(lambda: held in node.slice_devices(), "1.36: DRA slices")
        assert all(not taints for taints in node.slice_devices().values()), \
            node.slice_devices()
        await asyncio.sleep(1.5)  # polls that should not happen would have by now
    warned = [e for e in plugin.entries()
              if "cannot read the kubelet's PodResources API" in e.get("message", "")]
    assert len(warned) == 1, warned
    expected = {"missing": "does not exist", "refusing": "refuses connections",
                "hanging": "did not answer List within 2 s"}[fault]
    assert expected in warned[0]["message"], warned[0]
    assert not [e for e in plugin.entries() if e.get("message", "").startswith("node moved:")]



async def test_a_device_of_a_prepared_claim_stays_unhealthy_to_the_device_plugin_until_released(
        cluster, sockdir, logdir, tmp_path):
    """The reverse move: 1.36 -> 1.33 with a claim prepared and its pod running. The 1.33
    kubelet calls no unprepare (DRA off), so the claim holds the port until the API server
    says it is no longer reserved for a pod (the pod ended and the claim was released)."""
    api, _ = cluster
    async with holding_node(cluster, sockdir, logdir, tmp_path, model="1.36", extra=(
            "--metrics-port", str(Scraper.free_port()),
            "--metrics-address", "127.0.0.1")) as (node, plugin):
        metrics = await Scraper.of(plugin)
        kubelet = node.kubelet
        assert kubelet is not None and kubelet.dra is not None
        await until(node.dra_offers, "1.36: DRA slices")
        await kubelet.dra.wait_until(lambda: kubelet.dra.endpoints(DRIVER), SETTLE, "driver")
        names = sorted(node.slice_devices())
        held_name = names[0]
        ok, error = await prepare(api, kubelet, "c", held_name, pod="p")
        assert ok, error
        held_id = next(i for i in ("0000:3b:00.0", "0000:3b:00.0-port1")
                       if device_name(i) == held_name)

        kubelet = await node.boot("1.33")  # the claim's pod keeps running
        devices = await kubelet.wait_for_devices(
            RESOURCE, lambda ds: len(ds) == 2 and not ds[held_id].healthy, SETTLE)
        assert all(d.healthy for i, d in devices.items() if i != held_id), devices
        await metrics.until("one device held through DRA",
                            **{"devices_held_by_other_api__api=dra": 1})
        await until(lambda: held_events(api), "a DevicesHeldAcrossMove Event")

        api.set_claim_status("default", "c", {})  # the pod ended: deallocated
        await kubelet.wait_for_devices(RESOURCE, timeout=SETTLE)  # every device healthy
        await metrics.until("nothing held", **{"devices_held_by_other_api__api=dra": 0})
    said = [e.get("message", "") for e in plugin.entries()]
    moved = [m for m in said if m.startswith("node moved:")]
    assert len(moved) == 1 and "claim default/c" in moved[0] and held_id in moved[0], moved
    [event] = held_events(api)
    assert "held through DRA claims by claim default/c" in event["note"], event


async def test_a_plugin_started_after_the_move_back_still_holds_the_claimed_device(
        cluster, sockdir, logdir, tmp_path):
    """The plugin pod is replaced while the node goes back to 1.33 (a rollout during the
    downgrade): the new process finds the claim the old one prepared in the record."""
    api, registry = cluster
    async with holding_node(cluster, sockdir, logdir, tmp_path, model="1.36") as (node, first):
        kubelet = node.kubelet
        assert kubelet is not None and kubelet.dra is not None
        await until(node.dra_offers, "1.36: DRA slices")
        await kubelet.dra.wait_until(lambda: kubelet.dra.endpoints(DRIVER), SETTLE, "driver")
        ok, error = await prepare(api, kubelet, "c", "pci-0000-3b-00-0", pod="p")
        assert ok, error
        first.kill()
        kubelet = await node.boot("1.33")
        (tmp_path / "second").mkdir()
        second = start_plugin(sockdir, tmp_path / "second", registry, fake_node(tmp_path / "n2"),
                              api.write_kubeconfig(tmp_path / "kc2"), tmp_path,
                              "--pod-resources-socket", str(sockdir / "pr" / "kubelet.sock"))
        try:
            devices = await kubelet.wait_for_devices(
                RESOURCE, lambda ds: len(ds) == 2 and not ds["0000:3b:00.0"].healthy, SETTLE)
            assert devices["0000:3b:00.0-port1"].healthy
            api.set_claim_status("default", "c", {})
            await kubelet.wait_for_devices(RESOURCE, timeout=SETTLE)
        finally:
            second.kill()
