"""``serve --replicas``: each device advertised N times, against the real process and an
emulated kubelet of every device-plugin generation.

What a kubelet sees: N IDs ``<device ID>::<i>`` per device with the device's health and
NUMA node, every replica of a device turning Unhealthy in the same list, Allocate of replicas
giving the device's nodes once with ``ACCELERATOR_REPLICAS``, an ID it was never given
refused as any unknown ID while the plugin keeps serving, and preferred allocation spreading
a container's replicas over devices.
"""

from __future__ import annotations

import logging
import re

import grpc
import pytest

from compat_tests.fake_sysfs import FakeNode
from compat_tests.kubelet import PluginCallError
from compat_tests.plugin_process import PluginProcess

RESOURCE = "b-com.com/accelerator"
SETTLE = 15.0
"""Guards against hangs on a loaded 2-core machine; not a performance target."""
FIRST, SECOND = "0000:5e:00.0", "0000:d8:00.0"


def replicas_node(tmp_path) -> tuple[FakeNode, list[str]]:
    """Two Intel cards with one port each, on NUMA nodes 0 and 1; their port names."""
    node = FakeNode(tmp_path / "node")
    ports = node.add_opae_card(FIRST, numa_node=0) + node.add_dfl_card(SECOND, numa_node=1)
    return node, ports


def serve_flags(node: FakeNode, replicas: str = f"{RESOURCE}=3") -> list[str]:
    return ["--backend", "intel", "--sysfs-root", str(node.sysfs_root),
            "--dev-root", str(node.dev_root), "--health-interval", "0.2",
            "--replicas", replicas]


def every_replica(count: int = 3) -> list[str]:
    return [f"{device}::{i}" for device in (FIRST, SECOND) for i in range(count)]


def lists_seen(caplog: pytest.LogCaptureFixture) -> list[dict[str, str]]:
    """Each ListAndWatch list the emulated kubelet took, as ID -> health (its log line)."""
    seen = []
    for record in caplog.records:
        message = record.getMessage()
        if record.name.startswith("compat_tests.kubelet") and f"{RESOURCE} devices: " in message:
            listed = message.split(f"{RESOURCE} devices: ", 1)[1]
            seen.append(dict(re.match(r"(.+?)=(\w+)", entry).groups()  # type: ignore[union-attr]
                             for entry in listed.split()))
    return seen


@pytest.mark.parametrize("model", ["1.8", "1.9", "1.26"])
async def test_each_device_is_advertised_n_times_and_its_replicas_share_one_set_of_nodes(
        kubelet, plugin, tmp_path, model):
    node, _ports = replicas_node(tmp_path)
    emulated = await kubelet(model)
    daemon: PluginProcess = plugin(extra=serve_flags(node))

    devices = await emulated.wait_for_devices(
        RESOURCE, lambda d: len(d) == 6 and all(x.healthy for x in d.values()), SETTLE)
    assert sorted(devices) == every_replica()
    if emulated.model.reads_topology:
        assert {i: d.numa_nodes for i, d in devices.items()} == {
            **{f"{FIRST}::{i}": (0,) for i in range(3)},
            **{f"{SECOND}::{i}": (1,) for i in range(3)}}

    one = await emulated.allocate(RESOURCE, [f"{FIRST}::1"])
    two = await emulated.allocate(RESOURCE, [f"{FIRST}::2", f"{FIRST}::0"])
    assert one.devices and sorted(two.devices) == sorted(one.devices)
    assert len(set(two.devices)) == len(two.devices)
    assert two.envs["ACCELERATOR_UNITS"] == f"{FIRST},{FIRST}"
    assert two.envs["ACCELERATOR_DEVICES"] == f"{FIRST},{FIRST}"
    assert two.envs["ACCELERATOR_REPLICAS"] == "2,0"
    both = await emulated.allocate(RESOURCE, [f"{SECOND}::0", f"{FIRST}::1"])
    assert both.envs["ACCELERATOR_UNITS"] == f"{SECOND},{FIRST}"
    assert both.envs["ACCELERATOR_REPLICAS"] == "0,1"
    assert len(both.devices) == 2 * len(one.devices)
    said = [e.get("message", "") for e in daemon.entries()]
    assert any("each device advertised 3 times" in m for m in said), said
    assert f"--replicas: each device of {RESOURCE} is advertised 3 time(s)" in said, said


async def test_an_unhealthy_device_takes_every_replica_with_it_in_the_same_list(
        kubelet, plugin, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="compat_tests.kubelet")
    node, ports = replicas_node(tmp_path)
    emulated = await kubelet("1.26")
    plugin(extra=serve_flags(node))
    await emulated.wait_for_devices(RESOURCE, lambda d: len(d) == 6 and all(
        x.healthy for x in d.values()), SETTLE)

    node.set_port_error(ports[0], 1)
    devices = await emulated.wait_for_devices(
        RESOURCE, lambda d: not d[f"{FIRST}::0"].healthy, SETTLE)
    assert [i for i, d in devices.items() if not d.healthy] == [f"{FIRST}::{i}" for i in range(3)]
    node.set_port_error(ports[0], 0)
    await emulated.wait_for_devices(RESOURCE, lambda d: len(d) == 6 and all(
        x.healthy for x in d.values()), SETTLE)

    seen = lists_seen(caplog)
    assert any(listed.get(f"{FIRST}::1") == "Unhealthy" for listed in seen), seen
    for listed in seen:  # never one replica of a device ahead of another
        assert len(listed) == 6, listed
        assert len({listed[f"{FIRST}::{i}"] for i in range(3)}) == 1, listed
        assert {listed[f"{SECOND}::{i}"] for i in range(3)} == {"Healthy"}, listed


@pytest.mark.parametrize("model", ["1.9", "1.26"])
async def test_a_replica_it_never_advertised_is_refused_and_the_plugin_keeps_serving(
        kubelet, plugin, tmp_path, model):
    node, _ports = replicas_node(tmp_path)
    emulated = await kubelet(model)
    daemon: PluginProcess = plugin(extra=serve_flags(node))
    await emulated.wait_for_devices(RESOURCE, lambda d: len(d) == 6, SETTLE)

    for forged, named in [([f"{FIRST}::3"], f"{FIRST}::3"), ([FIRST], FIRST),
                          (["0000:99:00.0::0"], "0000:99:00.0::0"),
                          ([f"{FIRST}::01", f"{FIRST}::0"], f"{FIRST}::01")]:
        with pytest.raises(PluginCallError) as refused:
            await emulated.allocate(RESOURCE, forged)
        assert refused.value.code is grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details.startswith(f"unknown device IDs: {named} (this plugin "
                                                f"owns {FIRST}::0, {FIRST}::1"), refused.value
    granted = await emulated.allocate(RESOURCE, [f"{SECOND}::2"])
    assert granted.envs["ACCELERATOR_REPLICAS"] == "2"
    assert daemon.alive and emulated.is_connected(RESOURCE)
    assert len(emulated.registrations) == 1


async def test_preferred_allocation_spreads_a_containers_replicas_over_devices(
        kubelet, plugin, tmp_path):
    node, _ports = replicas_node(tmp_path)
    emulated = await kubelet("1.26")
    plugin(extra=serve_flags(node))
    await emulated.wait_for_devices(RESOURCE, lambda d: len(d) == 6, SETTLE)
    assert emulated.options(RESOURCE).preferred_allocation_available

    available = every_replica()
    assert await emulated.preferred_allocation(RESOURCE, available, [], 2) == [
        f"{FIRST}::0", f"{SECOND}::0"]
    # Two replicas of the first device in use by other containers: the second's first.
    busy = [i for i in available if i not in (f"{FIRST}::0", f"{FIRST}::1")]
    assert await emulated.preferred_allocation(RESOURCE, busy, [], 2) == [
        f"{SECOND}::0", f"{SECOND}::1"]
    assert await emulated.preferred_allocation(RESOURCE, available, [f"{SECOND}::2"], 2) == [
        f"{SECOND}::2", f"{FIRST}::0"]


async def test_one_replica_is_the_plain_device_plugin(kubelet, plugin, tmp_path):
    node, _ports = replicas_node(tmp_path)
    emulated = await kubelet("1.26")
    plugin(extra=serve_flags(node, replicas="*=1"))
    devices = await emulated.wait_for_devices(RESOURCE, lambda d: len(d) == 2, SETTLE)
    assert sorted(devices) == [FIRST, SECOND]
    granted = await emulated.allocate(RESOURCE, [FIRST])
    assert "ACCELERATOR_REPLICAS" not in granted.envs


async def test_cdi_names_a_device_once_however_many_of_its_replicas_are_given(
        kubelet, plugin, tmp_path):
    node, _ports = replicas_node(tmp_path)
    emulated = await kubelet("1.29")
    plugin(extra=[*serve_flags(node), "--cdi", "--cdi-spec-dir", str(tmp_path / "cdi"),
                  "--device-list-strategy", "cdi"])
    await emulated.wait_for_devices(RESOURCE, lambda d: len(d) == 6, SETTLE)
    granted = await emulated.allocate(RESOURCE, [f"{FIRST}::0", f"{FIRST}::2"])
    assert granted.cdi_devices == ["b-com.com/accelerator=0000-5e-00.0"]
    assert granted.devices == []
    specs = list((tmp_path / "cdi").glob("*"))
    assert specs, "no CDI spec written"
    assert all("::" not in p.read_text() for p in specs), "a replica ID in a CDI spec"
