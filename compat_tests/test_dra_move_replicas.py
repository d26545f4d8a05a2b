"""``serve --api auto --replicas``: no device has two owners across a move, whichever replica
holds it.

A pod that got one replica of a port through the 1.33 kubelet's device plugin holds the whole
port: after the upgrade to 1.36 the real ``serve`` publishes that port tainted
``<driver>/in-use`` and prepares no claim on it until the pod ends. The other way, a port a
DRA claim holds is advertised Unhealthy under every one of its replicas after the downgrade,
until the claim is released.
"""

from __future__ import annotations

import pytest

from compat_tests.dra_support import until
from compat_tests.kubelet import PluginCallError
from compat_tests.test_dra_auto import RESOURCE, SETTLE, cluster
from compat_tests.test_dra_move_holds import IN_USE, holding_node, prepare
from plugin.serving.dra.inventory import device_name

__all__ = ["cluster"]  # the fixture, shared with test_dra_auto
REPLICAS = ("--replicas", f"{RESOURCE}=3")
HELD, FREE = "0000:3b:00.0", "0000:3b:00.0-port1"
"""The fake node's two ports (test_dra_auto.fake_node)."""


def replicas_of(device_id: str) -> list[str]:
    return [f"{device_id}::{i}" for i in range(3)]


@pytest.mark.parametrize("replica", [0, 2])
async def test_a_device_held_by_one_replica_stays_out_of_dra_until_released(
        cluster, sockdir, logdir, tmp_path, replica):
    api, _ = cluster
    async with holding_node(cluster, sockdir, logdir, tmp_path, extra=REPLICAS) as (node,
                                                                                    plugin):
        kubelet = node.kubelet
        assert kubelet is not None
        await until(node.device_plugin_offers, "1.33: the device plugin")
        await kubelet.wait_for_devices(RESOURCE, lambda d: len(d) == 6, SETTLE)
        assert sorted(kubelet.devices(RESOURCE)) == sorted(replicas_of(HELD) + replicas_of(FREE))
        await kubelet.run_pod("default", "old", "main", RESOURCE, [f"{HELD}::{replica}"])

        kubelet = await node.boot("1.36")  # the pod keeps running across the upgrade
        held, free = device_name(HELD), device_name(FREE)
        await until(lambda: {held, free} <= set(node.slice_devices()), "1.36: DRA slices")
        published = node.slice_devices()
        assert set(published) == {held, free}, "a replica ID reached the slice"
        assert [t["key"] for t in published[held]] == [IN_USE], published
        assert published[free] == [], published

        assert kubelet.dra is not None
        await kubelet.dra.wait_until(lambda: kubelet.dra.endpoints("accelerator.b-com.com"),
                                     SETTLE, "driver")
        ok, error = await prepare(api, kubelet, "new", held)
        assert not ok and "in use through the device plugin" in (error or ""), error
        assert "default/old" in (error or ""), error

        kubelet.end_pod("default", "old")
        await until(lambda: not node.slice_devices().get(held, [True]),
                    "the released device offered untainted")
        ok, error = await prepare(api, kubelet, "after", held)
        assert ok, error
    moved = [e.get("message", "") for e in plugin.entries()
             if e.get("message", "").startswith("node moved:")]
    assert len(moved) == 1 and f"({HELD})" in moved[0], moved


async def test_a_device_a_claim_holds_is_advertised_by_none_of_its_replicas(
        cluster, sockdir, logdir, tmp_path):
    api, _ = cluster
    async with holding_node(cluster, sockdir, logdir, tmp_path, model="1.36",
                            extra=REPLICAS) as (node, _plugin):
        kubelet = node.kubelet
        assert kubelet is not None and kubelet.dra is not None
        await until(node.dra_offers, "1.36: DRA slices")
        await kubelet.dra.wait_until(lambda: kubelet.dra.endpoints("accelerator.b-com.com"),
                                     SETTLE, "driver")
        ok, error = await prepare(api, kubelet, "c", device_name(HELD), pod="p")
        assert ok, error

        kubelet = await node.boot("1.33")  # the claim's pod keeps running
        devices = await kubelet.wait_for_devices(
            RESOURCE, lambda d: len(d) == 6 and not d[f"{HELD}::0"].healthy, SETTLE)
        assert sorted(i for i, d in devices.items() if not d.healthy) == replicas_of(HELD)
        for lists in kubelet.lists_received(RESOURCE):
            assert sorted(lists) == sorted(replicas_of(HELD) + replicas_of(FREE)), lists
        with pytest.raises(PluginCallError) as refused:
            await kubelet.allocate(RESOURCE, [f"{HELD}::1"])
        assert refused.value.details.startswith(f"unhealthy device IDs: {HELD}::1 (held "
                                                "through DRA by claim default/c"), refused.value

        api.set_claim_status("default", "c", {})  # the pod ended: deallocated
        await kubelet.wait_for_devices(RESOURCE, lambda d: len(d) == 6 and all(
            x.healthy for x in d.values()), SETTLE)
