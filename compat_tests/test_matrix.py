"""The compatibility matrix: the real plugin process against emulated kubelets of every version.

Each case is something a kubelet operator does to a node (install, restart, upgrade,
downgrade, misconfigure) and asserts what the kubelet then sees over real unix sockets:
the registration, the advertised devices and the answers to Allocate. The plugin process is
never restarted by a test unless the case is about stopping it.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from compat_tests.fake_sysfs import FakeNode
from compat_tests.kubelet import PluginCallError

RESOURCE = "b-com.com/accelerator"
ALL_UNITS = ["0", "1", "2", "3"]
# Registration and recovery are event-driven in the plugin; these bounds only guard
# against hangs on a loaded 2-core machine and are not performance targets.
SETTLE = 15.0


def unit_ids(devices):
    return sorted(devices, key=int)


async def assert_serves_units(kubelet, units=ALL_UNITS):
    """The kubelet holds exactly ``units``, all healthy, and can allocate two of them."""
    devices = await kubelet.wait_for_devices(
        RESOURCE, lambda d: unit_ids(d) == units and all(x.healthy for x in d.values()),
        timeout=SETTLE,
    )
    assert unit_ids(devices) == units
    allocation = await kubelet.allocate(RESOURCE, ["1", "3"])
    assert allocation.envs["ACCELERATOR_UNITS"] == "1,3"
    return allocation


@pytest.mark.parametrize(
    ("model", "generation"),
    [("1.8", "v1alpha1"), ("1.9", "v1alpha2"), ("1.10", "v1beta1"), ("1.26", "v1beta1")],
)
async def test_register_advertise_allocate_and_stop(kubelet, plugin, model, generation):
    node = await kubelet(model)
    daemon = plugin()

    await assert_serves_units(node)
    assert [(r.resource_name, r.generation, r.endpoint) for r in node.registrations] == [
        (RESOURCE, generation, "accelerator.sock")]

    for bad, named in ((["7"], "7"), (["2", "2"], "2"), (["0", "9"], "9")):
        with pytest.raises(PluginCallError) as refused:
            await node.allocate(RESOURCE, bad)
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT, f"allocate {bad}"
        assert named in refused.value.details
    again = await node.allocate(RESOURCE, ["0"])  # a bad request never kills the daemon
    assert again.envs["ACCELERATOR_UNITS"] == "0"
    assert daemon.alive

    if node.model.calls_preferred_allocation:
        # Units carry no topology, so no preferred allocation could beat the kubelet's own
        # pick: none is advertised, and the kubelet makes one call per container, not two.
        assert not node.options(RESOURCE).preferred_allocation_available

    assert await daemon.terminate() == 0
    assert not daemon.socket_path.exists()


@pytest.mark.parametrize("model", ["1.9", "1.26"])
async def test_kubelet_restart_brings_devices_back(kubelet, plugin, model):
    first = await kubelet(model)
    daemon = plugin()
    await assert_serves_units(first)

    await first.stop()
    second = await kubelet(model)  # a starting kubelet deletes the plugin's socket
    await assert_serves_units(second)
    assert len(second.registrations) == 1
    assert daemon.alive


async def test_rolling_upgrade_and_downgrade_without_plugin_restart(kubelet, plugin):
    node = await kubelet("1.8")
    daemon = plugin()
    pid = daemon.pid
    seen = {"1.8": await assert_serves_units(node)}
    steps = (("1.9", "v1alpha2"), ("1.10", "v1beta1"), ("1.26", "v1beta1"), ("1.9", "v1alpha2"))
    for model, generation in steps:
        await node.stop()
        node = await kubelet(model)
        seen[model] = await assert_serves_units(node)
        assert [r.generation for r in node.registrations] == [generation], model
        assert daemon.alive and daemon.pid == pid
    # Every generation hands the container the same thing.
    first = seen["1.8"]
    for model, allocation in seen.items():
        assert (allocation.envs, allocation.devices, allocation.mounts) == (
            first.envs, first.devices, first.mounts), model


async def test_kubelet_absent_at_start_then_appearing(kubelet, plugin, sockdir):
    daemon = plugin()
    await daemon.wait_for_log(lambda e: "not registered" in e.get("message", ""),
                              what="report of the missing kubelet")
    await asyncio.sleep(1.0)
    assert daemon.alive
    node = await kubelet("1.26")
    await assert_serves_units(node)


async def test_kubelet_accepting_no_generation(kubelet, plugin):
    refusing = await kubelet("1.26", accept_no_version=True)
    daemon = plugin()

    def names_every_generation(entry):
        message = entry.get("message", "")
        return entry.get("level") == "error" and all(
            g in message for g in ("v1beta1", "v1alpha2", "v1alpha1"))

    error = await daemon.wait_for_log(names_every_generation, what="error naming generations")
    assert "not supported by kubelet" in error["message"]
    await refusing.wait_until(lambda: refusing.register_calls >= 3, timeout=SETTLE,
                              what="repeated Register attempts")
    assert refusing.registrations == []
    assert daemon.alive

    await refusing.stop()
    node = await kubelet("1.26")
    await assert_serves_units(node)


async def test_hanging_kubelet_register_is_retried_after_its_deadline(kubelet, plugin):
    hanging = await kubelet("1.26", hang_register=True)
    daemon = plugin(extra=["--register-timeout", "1"])
    await hanging.wait_until(lambda: hanging.register_calls >= 2, timeout=SETTLE,
                             what="Register retried after the deadline")
    assert daemon.alive

    await hanging.stop()
    node = await kubelet("1.26")
    await assert_serves_units(node)


async def test_hanging_kubelet_replaced_before_the_deadline(kubelet, plugin):
    # Default 15 s Register deadline: the replacement kubelet, not the deadline, ends the wait.
    hanging = await kubelet("1.26", hang_register=True)
    daemon = plugin()
    await hanging.wait_until(lambda: hanging.register_calls >= 1, timeout=SETTLE,
                             what="a Register call")
    await asyncio.sleep(0.5)
    await hanging.stop()
    node = await kubelet("1.9")
    await assert_serves_units(node)
    assert daemon.alive


async def test_two_plugins_same_resource_newest_wins(kubelet, plugin, sockdir):
    node = await kubelet("1.26")
    older = plugin(socket_name="a.sock", nb_units=4)
    await assert_serves_units(node)

    newer = plugin(socket_name="b.sock", nb_units=2)
    await node.wait_for_devices(RESOURCE, lambda d: unit_ids(d) == ["0", "1"], timeout=SETTLE)
    assert node.endpoint_socket(RESOURCE) == sockdir / "b.sock"
    with pytest.raises(PluginCallError) as refused:
        await node.allocate(RESOURCE, ["3"])  # the newest plugin owns only 0 and 1
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT

    # The older plugin must not fight back: its stream was closed, the kubelet did not restart.
    await asyncio.sleep(3.0)
    assert unit_ids(node.devices(RESOURCE)) == ["0", "1"]
    assert [r.endpoint for r in node.registrations] == ["a.sock", "b.sock"]
    assert older.alive and newer.alive


async def test_restricted_to_v1alpha2_against_recent_kubelet(kubelet, plugin):
    node = await kubelet("1.26")
    daemon = plugin(extra=["--api-versions", "v1alpha2"])
    entry = await daemon.wait_for_log(
        lambda e: "not registered" in e.get("message", "")
        and "unknown service deviceplugin.Registration" in e.get("message", ""),
        what="the reason it cannot register")
    assert "v1alpha2" in entry["message"]
    await asyncio.sleep(1.0)
    assert node.registrations == [] and node.register_calls == 0
    assert daemon.alive


@pytest.mark.parametrize("model", ["1.19", "1.26"])
async def test_preferred_allocation_follows_topology(kubelet, plugin, tmp_path, model):
    """Advertised once the devices span two NUMA nodes (on one, there is nothing to pack), by
    registering again: the kubelet reads options once."""
    fake = FakeNode(tmp_path / "node")
    fake.add_dfl_card("0000:3b:00.0", numa_node=0)
    fake.add_dfl_card("0000:d8:00.0", numa_node=0)
    node = await kubelet(model)
    daemon = plugin(extra=["--backend", "intel", "--sysfs-root", str(fake.sysfs_root),
                           "--dev-root", str(fake.dev_root), "--rescan-interval", "0.2"])
    await node.wait_for_devices(RESOURCE, lambda d: len(d) == 2, timeout=SETTLE)
    assert not node.options(RESOURCE).preferred_allocation_available

    (fake.function_path("0000:d8:00.0") / "numa_node").write_text("1\n")
    await node.wait_until(
        lambda: len(node.registrations) == 2 and node.is_connected(RESOURCE), timeout=SETTLE,
        what="a second registration, connected")
    await node.wait_for_devices(RESOURCE, lambda d: len(d) == 2, timeout=SETTLE)
    assert node.options(RESOURCE).preferred_allocation_available
    chosen = await node.preferred_allocation(
        RESOURCE, ["0000:3b:00.0", "0000:d8:00.0"], [], 1)
    assert chosen == ["0000:3b:00.0"]
    await asyncio.sleep(1.0)
    assert len(node.registrations) == 2, "registered again once, not on every rescan"
    assert daemon.alive
