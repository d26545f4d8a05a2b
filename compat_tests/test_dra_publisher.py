"""The slice publisher against the emulated API server: what a scheduler would find there.

Each case is something a real cluster does to a driver's ResourceSlices: the kubelet deleting
them at its start, an API server going down and coming back, upgraded behind the same address
to serve another resource.k8s.io version, refusing taints, answering 409 or 403. The slices
built here are small and fixed; the real shapes are tested beside ``api_versions``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from api_versions.resource_slices import slices_for
from compat_tests.apiserver import ApiServerEmulator, validate
from compat_tests.apiserver.client import ApiClient
from compat_tests.dra_support import until
from compat_tests.fake_sysfs import CRASHED_AFU_ID, FakeNode
from plugin.discovery.backends.intel import IntelBackend
from plugin.serving.dra.apiserver import ApiRefused, ApiServer, NoResourceApi
from plugin.serving.dra.inventory import pool_of
from plugin.serving.dra.publisher import SlicePublisher
from value_types.devices import DeviceSet

NODE = "node-a"
DRIVER = "accelerator.b-com.com"
SETTLE = 5.0


class Devices:
    """What the node has: names, and which are unhealthy."""

    def __init__(self, *names: str) -> None:
        self.names = list(names)
        self.unhealthy: set[str] = set()
        self.shared: set[str] = set()

    def build(self, version: str, generation: int, node_uid: str, taints: bool) -> list[dict]:
        devices = []
        for name in self.names:
            if name in self.unhealthy and not taints:
                continue
            fields: dict[str, Any] = {"attributes": {"family": {"string": "units"}}}
            if name in self.unhealthy:
                fields["taints"] = [{"key": f"{DRIVER}/unhealthy", "effect": "NoSchedule"}]
            if name in self.shared:
                fields["allowMultipleAllocations"] = True
                fields["capacity"] = {"contexts": {"value": "4", "requestPolicy": {
                    "default": "1", "validRange": {"min": "1", "max": "4", "step": "1"}}}}
            devices.append({"name": name, **({"basic": fields} if version == "v1beta1"
                                              else fields)})
        return [{
            "apiVersion": f"resource.k8s.io/{version}", "kind": "ResourceSlice",
            "metadata": {"generateName": f"{NODE}-{DRIVER}-", "ownerReferences": [{
                "apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node_uid,
                "controller": True}]},
            "spec": {"driver": DRIVER, "nodeName": NODE, "devices": devices,
                     "pool": {"name": NODE, "generation": generation, "resourceSliceCount": 1}},
        }]


@pytest.fixture
async def server() -> AsyncIterator[ApiServerEmulator]:
    async with ApiServerEmulator("1.36") as api:
        api.create_node(NODE)
        yield api


@pytest.fixture
def connect(server: ApiServerEmulator, tmp_path: Path):
    """A client of the emulated server (``publishing`` closes it)."""

    def make(timeout: float = 2.0) -> ApiServer:
        return ApiServer.connect(server.write_kubeconfig(tmp_path / "kubeconfig"), timeout)

    return make


@contextlib.asynccontextmanager
async def publishing(api: ApiServer, devices: Devices,
                     **knobs: Any) -> AsyncIterator[SlicePublisher]:
    publisher = SlicePublisher(api, NODE, DRIVER, devices.build, backoff_max=0.2, **knobs)
    task = asyncio.create_task(publisher.run())
    try:
        yield publisher
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await api.close()


def slices(server: ApiServerEmulator, version: str = "v1") -> list[dict]:
    return [s for s in server.list("resourceslices", version=version)
            if s["spec"]["nodeName"] == NODE]


def device_names(server: ApiServerEmulator) -> list[str]:
    return sorted(d["name"] for s in slices(server) for d in s["spec"].get("devices", []))


async def test_the_pool_is_published_owned_by_the_node_and_valid(server, connect):
    devices = Devices("unit-0", "unit-1")
    async with publishing(connect(), devices):
        await until(lambda: device_names(server) == ["unit-0", "unit-1"], "published")
    [published] = slices(server)
    assert published["metadata"]["ownerReferences"][0]["uid"] == \
        server.get("nodes", NODE)["metadata"]["uid"]
    assert published["metadata"]["name"].startswith(f"{NODE}-{DRIVER}-")
    assert validate(published, "v1") == []


async def test_a_change_is_published_under_a_higher_generation(server, connect):
    devices = Devices("unit-0")
    async with publishing(connect(), devices) as publisher:
        await until(lambda: device_names(server) == ["unit-0"], "first")
        first = slices(server)[0]["spec"]["pool"]["generation"]
        devices.names.append("unit-1")
        publisher.devices_changed()
        await until(lambda: device_names(server) == ["unit-0", "unit-1"], "hot-plugged")
        [after] = slices(server)
        assert after["spec"]["pool"]["generation"] > first
        assert after["metadata"]["name"] == slices(server)[0]["metadata"]["name"], \
            "the slice is replaced in place, not deleted and created"
        writes = len(server.find_requests(verb="update", resource="resourceslices"))
        publisher.devices_changed()  # nothing changed: nothing written
        await asyncio.sleep(0.3)
        assert len(server.find_requests(verb="update", resource="resourceslices")) == writes


async def test_a_wake_with_nothing_to_change_asks_the_server_nothing(server, connect):
    """Every claim a driver that shares devices prepares wakes its publisher (what claims
    hold decides how a device is published); most change nothing, and must cost the API
    server nothing either. Someone else's hand on the slices is still undone: the watch
    sees it."""
    devices = Devices("unit-0")
    async with publishing(connect(), devices) as publisher:
        await until(lambda: device_names(server) == ["unit-0"], "published")
        await until(lambda: server.find_requests(verb="watch", resource="resourceslices"),
                    "watched")
        await asyncio.sleep(0.2)
        before = len(server.requests)
        for _ in range(20):
            publisher.devices_changed()
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)
        assert [f"{r.verb} {r.resource}" for r in server.requests[before:]] == []
        [ours] = slices(server)
        server.delete("resourceslices", ours["metadata"]["name"])
        await until(lambda: device_names(server) == ["unit-0"], "published again")
        devices.names.append("unit-1")
        publisher.devices_changed()
        await until(lambda: device_names(server) == ["unit-0", "unit-1"], "a change published")


async def test_slices_wiped_at_kubelet_start_are_put_back(server, connect):
    """How soon is bench/dra.py's ("kubelet start wipe -> all back")."""
    devices = Devices("unit-0", "unit-1")
    async with publishing(connect(), devices):
        await until(lambda: len(device_names(server)) == 2, "published")
        async with ApiClient(server.url, server.token, server.ca_file) as kubelet:
            reply = await kubelet.delete("/apis/resource.k8s.io/v1/resourceslices",
                                         fieldSelector=f"spec.nodeName={NODE}")
            assert reply.status == 200
        assert device_names(server) == []
        await until(lambda: len(device_names(server)) == 2, "republished")


async def test_a_foreign_slice_of_our_pool_is_removed(server, connect):
    devices = Devices("unit-0")
    async with publishing(connect(), devices):
        await until(lambda: len(slices(server)) == 1, "published")
        stray = devices.build("v1", 1, server.get("nodes", NODE)["metadata"]["uid"], True)[0]
        server.create(stray)
        await until(lambda: len(slices(server)) == 1, "stray removed")


async def test_unhealthy_devices_are_tainted_or_left_out_where_taints_are_dropped(tmp_path):
    for gates, expect_taint in (("DRADeviceTaints=true", True), ("DRADeviceTaints=false", False)):
        async with ApiServerEmulator("1.36", feature_gates=gates) as server:
            server.create_node(NODE)
            devices = Devices("unit-0", "unit-1")
            devices.unhealthy.add("unit-1")
            api = ApiServer.connect(server.write_kubeconfig(tmp_path / gates), 2.0)
            async with publishing(api, devices):
                if expect_taint:
                    await until(lambda: len(device_names(server)) == 2, "published, tainted")
                    [tainted] = [d for d in slices(server)[0]["spec"]["devices"]
                                 if d["name"] == "unit-1"]
                    assert tainted["taints"][0]["effect"] == "NoSchedule"
                else:
                    await until(lambda: device_names(server) == ["unit-0"], "unhealthy left out")


async def test_a_server_dropping_shared_devices_fields_is_said_once(tmp_path, caplog):
    """1.35 has DRAConsumableCapacity off: it stores a shared device without
    allowMultipleAllocations (its scheduler then allocates it whole). The slices are still
    published; the warning names the devices, once, not at every republish."""
    caplog.set_level(logging.WARNING, logger="plugin.serving.dra")
    for model, dropped in (("1.36", False), ("1.35", True)):
        caplog.clear()
        async with ApiServerEmulator(model) as server:
            server.create_node(NODE)
            devices = Devices("unit-0", "unit-1")
            devices.shared.add("unit-1")
            api = ApiServer.connect(server.write_kubeconfig(tmp_path / model), 2.0)
            async with publishing(api, devices) as publisher:
                await until(lambda: len(device_names(server)) == 2, "published")
                devices.names.append("unit-2")  # a change: written again
                publisher.devices_changed()
                await until(lambda: len(device_names(server)) == 3, "republished")
                [stored] = [d for d in slices(server)[0]["spec"]["devices"]
                            if d["name"] == "unit-1"]
                assert stored.get("allowMultipleAllocations") is (None if dropped else True)
        said = [r.getMessage() for r in caplog.records
                if "dropped allowMultipleAllocations" in r.getMessage()]
        assert len(said) == (1 if dropped else 0), said
        if dropped:
            assert "unit-1" in said[0] and "unit-0" not in said[0]


async def test_an_outage_is_ridden_out_and_logged_once(server, connect, caplog):
    caplog.set_level(logging.INFO, logger="plugin.serving.dra")
    devices = Devices("unit-0")
    async with publishing(connect(timeout=0.5), devices) as publisher:
        await until(lambda: len(device_names(server)) == 1, "published")
        await server.go_down()
        devices.names.append("unit-1")
        publisher.devices_changed()
        await asyncio.sleep(1.5)
        await server.come_back()
        await until(lambda: len(device_names(server)) == 2, "published after the outage")
        # The server stores the slice before its answer reaches the publisher, which says
        # the outage is over only then: wait for the word, not just the slice.
        await until(lambda: any("answers again" in r.getMessage() for r in caplog.records),
                    "the end of the outage said")
    warnings = [r for r in caplog.records if "cannot publish" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]


async def test_an_upgraded_server_is_spoken_to_in_its_version(tmp_path):
    async with ApiServerEmulator("1.33", runtime_config="resource.k8s.io/v1beta1=true") as server:
        server.create_node(NODE)
        api = ApiServer.connect(server.write_kubeconfig(tmp_path / "kc"), 2.0)
        devices = Devices("unit-0")
        async with publishing(api, devices) as publisher:
            await until(lambda: len(slices(server, "v1beta1")) == 1, "published in v1beta1")
            assert api.version == "v1beta1"
            await server.restart("1.36")
            devices.names.append("unit-1")
            publisher.devices_changed()
            await until(lambda: api.version == "v1" and len(device_names(server)) == 2,
                        "published through v1 after the upgrade")


async def test_no_resource_api_and_forbidden_are_told_apart(tmp_path):
    async with ApiServerEmulator("1.33") as server:  # resource.k8s.io not served by default
        api = ApiServer.connect(server.write_kubeconfig(tmp_path / "kc"), 2.0)
        with pytest.raises(NoResourceApi):
            await api.resource_version()
        await api.close()
    async with ApiServerEmulator("1.36") as server:
        server.faults.deny("get", "resourceclaims")
        api = ApiServer.connect(server.write_kubeconfig(tmp_path / "kc2"), 2.0)
        with pytest.raises(ApiRefused, match="403"):
            await api.get_claim("default", "c")
        await api.close()


async def test_a_server_without_the_taints_field_gets_the_healthy_devices(tmp_path):
    """1.32's resource.k8s.io has no taints field: a tainted slice is refused whole (400)."""
    async with ApiServerEmulator("1.32", runtime_config="resource.k8s.io/v1beta1=true") as server:
        server.create_node(NODE)
        devices = Devices("unit-0", "unit-1")
        devices.unhealthy.add("unit-0")
        api = ApiServer.connect(server.write_kubeconfig(tmp_path / "kc"), 2.0)
        async with publishing(api, devices):
            await until(lambda: [d["name"] for s in slices(server, "v1beta1")
                                 for d in s["spec"]["devices"]] == ["unit-1"],
                        "published without the unhealthy device")


async def test_real_devices_publish_as_the_server_validates_them(server, connect, tmp_path):
    fake = FakeNode(tmp_path / "node")
    fake.add_dfl_card("0000:3b:00.0", ports=2)
    fake.add_dfl_card("0000:5e:00.0", afu_id=CRASHED_AFU_ID)
    node = DeviceSet.of(IntelBackend(fake.config()).scan())

    def build(version: str, generation: int, node_uid: str, taints: bool) -> list[dict]:
        return slices_for(version, pool_of(DRIVER, NODE, node), generation, node_uid, taints)

    api = connect()
    publisher = SlicePublisher(api, NODE, DRIVER, build, backoff_max=0.2)
    task = asyncio.create_task(publisher.run())
    try:
        await until(lambda: len(device_names(server)) == 3, "three ports published")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await api.close()
    [published] = slices(server)
    assert validate(published, "v1") == []
    crashed = [d for d in published["spec"]["devices"] if d.get("taints")]
    assert [d["name"] for d in crashed] == ["pci-0000-5e-00-0"]


async def test_a_withdrawal_removes_a_slice_whose_write_was_cut_off(server, connect):
    """A move off DRA cancels publishing, then withdraws: a create the server stored after
    the cancellation cut its answer off is the pool's all the same, and must go."""
    devices = Devices("unit-0")
    api = connect()
    async with publishing(api, devices) as publisher:
        await until(lambda: len(slices(server)) == 1, "published")
    # The server stored one more slice of the pool whose answer the publisher never read.
    stray = devices.build("v1", 2, server.get("nodes", NODE)["metadata"]["uid"], True)[0]
    server.create(stray)
    assert len(slices(server)) == 2
    api = connect()
    publisher._api = api  # the publisher's own client was closed with its task
    try:
        await publisher.withdraw()
    finally:
        await api.close()
    assert slices(server) == []
