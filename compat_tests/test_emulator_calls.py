"""The kubelet emulator's calls after registration, as each kubelet version makes them.

ListAndWatch streams and which registration wins, Allocate across generations, topology,
preferred allocation, PreStartContainer and the options a kubelet reads, and the command
line; registration itself is in ``test_emulator``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import grpc
import pytest

from compat_tests.fake_plugin import FakePlugin
from compat_tests.kubelet import (
    FeatureUnavailable,
    KubeletEmulator,
    NotRegistered,
    PluginCallError,
)

RESOURCE = "example.com/fake"


@pytest.mark.parametrize("model", ["1.8", "1.9", "1.26"])
async def test_one_stream_latest_list_and_no_reconnect(stack, sockdir, model):
    kubelet = await stack(KubeletEmulator(sockdir, model))
    plugin = await stack(FakePlugin(sockdir, "p.sock", kubelet.generation))
    await plugin.register(kubelet.socket_path, resource_name=RESOURCE)
    devices = await kubelet.wait_for_devices(RESOURCE)
    assert sorted(devices) == ["a", "b"]
    plugin.set_devices({"a": "Healthy", "b": "Unhealthy", "c": "Healthy"})
    devices = await kubelet.wait_for_devices(RESOURCE, lambda d: len(d) == 3)
    assert [d.health for d in devices.values()] == ["Healthy", "Unhealthy", "Healthy"]
    assert plugin.streams_opened == 1

    plugin.end_streams()
    if kubelet.generation == "v1beta1":
        after = await kubelet.wait_for_devices(
            RESOURCE, lambda d: d and not any(x.healthy for x in d.values()))
        assert sorted(after) == ["a", "b", "c"]
    else:
        await kubelet.wait_until(lambda: not kubelet.devices(RESOURCE), what="dropped devices")
    assert not kubelet.is_connected(RESOURCE)
    await asyncio.sleep(0.5)
    assert plugin.streams_opened == 1  # the kubelet never reconnects by itself
    with pytest.raises(NotRegistered):
        await kubelet.allocate(RESOURCE, ["a"])


@pytest.mark.parametrize("model", ["1.9", "1.24"])
async def test_newest_registration_wins(stack, sockdir, model):
    kubelet = await stack(KubeletEmulator(sockdir, model))
    old = await stack(FakePlugin(sockdir, "old.sock", kubelet.generation, tag="old"))
    new = await stack(FakePlugin(sockdir, "new.sock", kubelet.generation,
                                 {"x": "Healthy"}, tag="new"))
    await old.register(kubelet.socket_path, resource_name=RESOURCE)
    await kubelet.wait_for_devices(RESOURCE, lambda d: sorted(d) == ["a", "b"])
    await new.register(kubelet.socket_path, resource_name=RESOURCE)
    await kubelet.wait_for_devices(RESOURCE, lambda d: sorted(d) == ["x"])
    assert kubelet.endpoint_socket(RESOURCE) == new.socket_path
    await kubelet.wait_until(lambda: old.streams_active == 0, what="old stream closed")
    old.set_devices({"zzz": "Healthy"})  # the old plugin is no longer listened to
    await asyncio.sleep(0.3)
    assert sorted(kubelet.devices(RESOURCE)) == ["x"]
    allocation = await kubelet.allocate(RESOURCE, ["x"])
    assert allocation.envs["FAKE_TAG"] == "new"
    assert [r.endpoint for r in kubelet.registrations] == ["old.sock", "new.sock"]


async def _old_then_new(stack, sockdir, kubelet):
    """Two instances of one resource on two sockets, the second registered while the first
    still streams (what a plugin that registers before its predecessor has gone does)."""
    old = await stack(FakePlugin(sockdir, "old.sock", kubelet.generation, tag="old"))
    new = await stack(FakePlugin(sockdir, "new.sock", kubelet.generation,
                                 {"x": "Healthy"}, tag="new"))
    await old.register(kubelet.socket_path, resource_name=RESOURCE)
    await kubelet.wait_for_devices(RESOURCE, lambda d: sorted(d) == ["a", "b"])
    await new.register(kubelet.socket_path, resource_name=RESOURCE)
    await kubelet.wait_for_devices(RESOURCE, lambda d: sorted(d) == ["x"])
    return old, new


@pytest.mark.parametrize("model", ["1.26", "1.35"])
async def test_an_older_stream_ending_disconnects_the_newest_client(stack, sockdir, model):
    """handler.go before kubernetes#135437: ``runClient`` disconnects ``getClient(name)``."""
    kubelet = await stack(KubeletEmulator(sockdir, model))
    old, new = await _old_then_new(stack, sockdir, kubelet)
    assert old.streams_active == 1  # the old client keeps running beside the new one
    old.set_devices({"zzz": "Healthy"})  # and its lists still reach the manager
    await kubelet.wait_for_devices(RESOURCE, lambda d: sorted(d) == ["zzz"])

    old.end_streams()
    await kubelet.wait_until(lambda: new.streams_active == 0, what="the new stream closed")
    assert not kubelet.is_connected(RESOURCE)
    assert not any(d.healthy for d in kubelet.devices(RESOURCE).values())
    assert [e.socket_path for e in kubelet.clients.dropped_by_older] == [new.socket_path]


async def test_1_36_an_older_stream_ending_still_marks_the_resource_unhealthy(stack, sockdir):
    """Clients keyed by socket path too (#135437): the new stream stays, but
    ``PluginDisconnected(name)`` marks the resource's devices unhealthy until its next list."""
    kubelet = await stack(KubeletEmulator(sockdir, "1.36"))
    old, new = await _old_then_new(stack, sockdir, kubelet)
    old.end_streams()
    await kubelet.wait_for_devices(RESOURCE, lambda d: d and not any(
        x.healthy for x in d.values()))
    assert new.streams_active == 1 and kubelet.endpoint_socket(RESOURCE) == new.socket_path
    assert kubelet.clients.dropped_by_older == []
    new.set_devices({"x": "Healthy", "y": "Healthy"})
    await kubelet.wait_for_devices(RESOURCE, lambda d: sorted(d) == ["x", "y"])


@pytest.mark.parametrize("model", ["1.24", "1.26", "1.36"])
async def test_registering_after_the_old_stream_ended_keeps_the_new_plugin(stack, sockdir,
                                                                           model):
    kubelet = await stack(KubeletEmulator(sockdir, model))
    old = await stack(FakePlugin(sockdir, "old.sock", kubelet.generation, tag="old"))
    await old.register(kubelet.socket_path, resource_name=RESOURCE)
    await kubelet.wait_for_devices(RESOURCE)
    old.end_streams()
    await kubelet.wait_until(lambda: not kubelet.is_connected(RESOURCE), what="old end")
    new = await stack(FakePlugin(sockdir, "new.sock", kubelet.generation, {"x": "Healthy"}))
    await new.register(kubelet.socket_path, resource_name=RESOURCE)
    await kubelet.wait_for_devices(RESOURCE, lambda d: sorted(d) == ["x"])
    await asyncio.sleep(0.3)
    assert kubelet.is_connected(RESOURCE) and new.streams_active == 1
    assert kubelet.clients.dropped_by_older == []


async def test_allocation_is_normalised_across_generations(stack, sockdir):
    seen = {}
    for model in ("1.8", "1.9", "1.10", "1.29"):
        directory = sockdir / model
        kubelet = await stack(KubeletEmulator(directory, model))
        plugin = await stack(FakePlugin(directory, "p.sock", kubelet.generation))
        await plugin.register(kubelet.socket_path, resource_name=RESOURCE)
        await kubelet.wait_for_devices(RESOURCE)
        seen[model] = await kubelet.allocate(RESOURCE, ["b", "a"])
    for allocation in seen.values():
        assert allocation.envs == {"FAKE_IDS": "b,a", "FAKE_TAG": "fake"}
        assert allocation.devices == [("/dev/fakeb", "/dev/fakeb", "rw"),
                                      ("/dev/fakea", "/dev/fakea", "rw")]
        assert allocation.mounts == [("/opt/fake", "/srv/fake", True)]
    assert seen["1.10"].annotations == {"fake": "yes"}
    assert seen["1.10"].cdi_devices == []  # CDI devices are read from 1.28 on
    assert seen["1.29"].cdi_devices == ["fake.com/x=1"]


@pytest.mark.parametrize("model", ["1.8", "1.9", "1.26"])
async def test_allocate_error_carries_code_and_message(stack, sockdir, model):
    kubelet = await stack(KubeletEmulator(sockdir, model))
    plugin = await stack(FakePlugin(sockdir, "p.sock", kubelet.generation))
    await plugin.register(kubelet.socket_path, resource_name=RESOURCE)
    await kubelet.wait_for_devices(RESOURCE)
    with pytest.raises(PluginCallError) as failed:
        await kubelet.allocate(RESOURCE, ["a", "nope"])
    assert failed.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "nope" in failed.value.details
    assert failed.value.method.endswith("DevicePlugin/Allocate")


@pytest.mark.parametrize(("model", "numa"), [("1.15", ()), ("1.16", (1,)), ("1.26", (1,))])
async def test_topology_is_read_from_1_16(stack, sockdir, model, numa):
    kubelet = await stack(KubeletEmulator(sockdir, model))
    plugin = await stack(FakePlugin(sockdir, "p.sock", "v1beta1", numa=1))
    await plugin.register(kubelet.socket_path, resource_name=RESOURCE)
    devices = await kubelet.wait_for_devices(RESOURCE)
    assert {d.numa_nodes for d in devices.values()} == {numa}


async def test_preferred_allocation_only_when_advertised_and_known(stack, sockdir):
    kubelet = await stack(KubeletEmulator(sockdir / "new", "1.26"))
    plugin = await stack(FakePlugin(sockdir / "new", "p.sock", "v1beta1",
                                    {"a": "Healthy", "b": "Healthy", "c": "Healthy"},
                                    preferred_available=True))
    await plugin.register(kubelet.socket_path, resource_name=RESOURCE)
    await kubelet.wait_for_devices(RESOURCE)
    assert await kubelet.preferred_allocation(RESOURCE, ["c", "b", "a"], ["c"], 2) == ["c", "a"]

    old = await stack(KubeletEmulator(sockdir / "old", "1.18"))
    plugin18 = await stack(FakePlugin(sockdir / "old", "p.sock", "v1beta1",
                                      preferred_available=True))
    await plugin18.register(old.socket_path, resource_name=RESOURCE)
    await old.wait_for_devices(RESOURCE)
    with pytest.raises(FeatureUnavailable):
        await old.preferred_allocation(RESOURCE, ["a", "b"], [], 1)

    quiet = await stack(KubeletEmulator(sockdir / "q", "1.26"))
    plain = await stack(FakePlugin(sockdir / "q", "p.sock", "v1beta1"))
    await plain.register(quiet.socket_path, resource_name=RESOURCE)
    await quiet.wait_for_devices(RESOURCE)
    with pytest.raises(FeatureUnavailable, match="does not advertise"):
        await quiet.preferred_allocation(RESOURCE, ["a", "b"], [], 1)


@pytest.mark.parametrize(("model", "expected"), [("1.10", True), ("1.26", True), ("1.9", False)])
async def test_pre_start_only_when_required(stack, sockdir, model, expected):
    kubelet = await stack(KubeletEmulator(sockdir, model))
    plugin = await stack(FakePlugin(sockdir, "p.sock", kubelet.generation,
                                    pre_start_required=True))
    await plugin.register(kubelet.socket_path, resource_name=RESOURCE)
    await kubelet.wait_for_devices(RESOURCE)
    allocation = await kubelet.allocate(RESOURCE, ["a"])
    assert allocation.pre_started is expected
    assert plugin.pre_started == ([["a"]] if expected else [])


async def test_kubelets_before_1_26_take_options_from_register_request(stack, sockdir):
    # 1.10 .. 1.25 never call GetDevicePluginOptions: the RegisterRequest carries them.
    kubelet = await stack(KubeletEmulator(sockdir, "1.20"))
    plugin = await stack(FakePlugin(sockdir, "p.sock", "v1beta1", serve_options=False,
                                    pre_start_required=True, preferred_available=True))
    await plugin.register(kubelet.socket_path, resource_name=RESOURCE)
    await kubelet.wait_for_devices(RESOURCE)
    assert kubelet.options(RESOURCE).pre_start_required
    assert (await kubelet.allocate(RESOURCE, ["b"])).pre_started


async def test_accept_no_version_refuses_everything(stack, sockdir):
    kubelet = await stack(KubeletEmulator(sockdir, "1.26", accept_no_version=True))
    plugin = await stack(FakePlugin(sockdir, "p.sock", "v1beta1"))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await plugin.register(kubelet.socket_path)
    assert refused.value.details() == (
        'requested API version "v1beta1" is not supported by kubelet. Supported version is []')


async def test_hanging_register_never_answers(stack, sockdir):
    kubelet = await stack(KubeletEmulator(sockdir, "1.26", hang_register=True))
    plugin = await stack(FakePlugin(sockdir, "p.sock", "v1beta1"))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await plugin.register(kubelet.socket_path, timeout=0.5)
    assert refused.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    waiting = asyncio.create_task(plugin.register(kubelet.socket_path, timeout=30))
    await asyncio.sleep(0.2)
    await asyncio.wait_for(kubelet.stop(), 5)  # stopping is not held up by the hung call
    with pytest.raises(grpc.aio.AioRpcError):
        await waiting
    assert kubelet.registrations == []


async def test_command_line_runs_until_sigterm(sockdir):
    process = subprocess.Popen(
        [sys.executable, "-m", "compat_tests.kubelet", "--dir", str(sockdir), "--model", "1.9"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        for _ in range(200):
            if (sockdir / "kubelet.sock").exists():
                break
            await asyncio.sleep(0.05)
        plugin = FakePlugin(sockdir, "p.sock", "v1alpha2")
        await plugin.start()
        try:
            await plugin.register(sockdir / "kubelet.sock", resource_name=RESOURCE)
            for _ in range(100):
                if plugin.streams_opened:
                    break
                await asyncio.sleep(0.05)
        finally:
            await plugin.stop()
        os.kill(process.pid, signal.SIGTERM)
        output, _ = process.communicate(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0
    assert "registered example.com/fake (version v1alpha2) at p.sock" in output
    assert "a=Healthy b=Healthy" in output
    assert not (sockdir / "kubelet.sock").exists()
