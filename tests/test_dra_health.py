"""HealthBroadcaster: complete health lists per change, resent before the kubelet's timeout."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from plugin.model.feed import DeviceFeed
from plugin.serving.dra.health import HealthBroadcaster, health_of
from value_types.devices import Device, DeviceSet, Health
from value_types.health import DeviceHealthReport, HealthState

NAMES = {"fpga-0": "0000:5e:00.0", "fpga-1": "0000:5e:00.1", "fpga-2": "0000:86:00.0"}
STALLED = ("device discovery stalled: scan of intel has not returned for 10 s; "
           "stuck reading /sys/class/fpga_region")


def devices(**health):
    return DeviceSet.of(
        Device(i, "intel", health=Health.UNHEALTHY if health.get(i) else Health.HEALTHY,
               health_reason=health.get(i) or "")
        for i in ("0000:5e:00.0", "0000:5e:00.1"))


def states(reports):
    return {r.device: (r.state, r.message) for r in reports}


@pytest.fixture
def feed():
    return DeviceFeed(devices())


def broadcaster(feed, names=NAMES, **options):
    options.setdefault("resend_every", 5.0)
    return HealthBroadcaster("node-1", feed, lambda: names, clock=lambda: 1700000000.7,
                             **options)


def test_health_is_never_better_than_known():
    assert health_of(Device("a", "intel")) == (HealthState.HEALTHY, "")
    assert health_of(Device("a", "intel", health=Health.UNHEALTHY,
                            health_reason="AFU ID reads all f")) == (
        HealthState.UNHEALTHY, "AFU ID reads all f")
    assert health_of(Device("a", "intel", health=Health.UNHEALTHY)) == (
        HealthState.UNHEALTHY, "unhealthy")
    assert health_of(None) == (HealthState.UNKNOWN, "device not found by discovery on this node")
    stalled = Device("a", "intel", health=Health.UNHEALTHY, health_reason=STALLED)
    assert health_of(stalled) == (HealthState.UNKNOWN, STALLED)
    long = Device("a", "intel", health=Health.UNHEALTHY, health_reason="x" * 5000)
    assert len(health_of(long)[1]) == 1024


def test_the_list_is_complete_and_ordered_by_device_name(feed):
    reports = broadcaster(feed, timeout_seconds=30).current()
    assert reports == (
        DeviceHealthReport("node-1", "fpga-0", HealthState.HEALTHY, 1700000000, 30, ""),
        DeviceHealthReport("node-1", "fpga-1", HealthState.HEALTHY, 1700000000, 30, ""),
        DeviceHealthReport("node-1", "fpga-2", HealthState.UNKNOWN, 1700000000, 30,
                           "device not found by discovery on this node"))


def test_a_resend_period_the_kubelet_would_time_out_on_is_refused(feed):
    with pytest.raises(ValueError, match="shorter than timeout_seconds"):
        broadcaster(feed, timeout_seconds=10, resend_every=10)


async def test_a_stream_gets_the_list_then_every_change(feed):
    health = broadcaster(feed)
    stream = health.watch()
    assert states(await anext(stream))["fpga-0"] == (HealthState.HEALTHY, "")
    await feed.publish(devices(**{"0000:5e:00.0": "port error 0x4"}))
    assert states(await asyncio.wait_for(anext(stream), 1))["fpga-0"] == (
        HealthState.UNHEALTHY, "port error 0x4")
    await feed.publish(devices())
    assert states(await asyncio.wait_for(anext(stream), 1))["fpga-0"] == (HealthState.HEALTHY, "")
    await stream.aclose()
    await health.close()


async def test_a_change_that_leaves_health_alone_sends_nothing(feed):
    health = broadcaster(feed)
    stream = health.watch()
    await anext(stream)
    await feed.publish(DeviceSet.of(replace(d, numa_node=1) for d in devices()))
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(anext(stream), 0.2)
    await health.close()


async def test_the_list_is_resent_while_nothing_changes(feed):
    health = broadcaster(feed, resend_every=0.1)
    stream = health.watch()
    first = await anext(stream)
    again = await asyncio.wait_for(anext(stream), 1)
    assert again == first
    await health.close()


async def test_frequent_changes_that_leave_health_alone_do_not_delay_the_resend(feed):
    health = broadcaster(feed, resend_every=0.3)
    stream = health.watch()
    await anext(stream)
    received = asyncio.ensure_future(anext(stream))
    for numa in range(8):
        await feed.publish(DeviceSet.of(replace(d, numa_node=numa) for d in devices()))
        await asyncio.sleep(0.1)
        if received.done():
            break
    assert received.done(), "resent within its period despite the changes"
    await health.close()


async def test_many_streams_each_get_the_current_list_and_the_changes(feed):
    health = broadcaster(feed)
    streams = [health.watch() for _ in range(3)]
    for stream in streams:
        await anext(stream)
    assert health.streams == 3
    await feed.publish(devices(**{"0000:5e:00.1": "node missing"}))
    for stream in streams:
        assert states(await asyncio.wait_for(anext(stream), 1))["fpga-1"][0] is \
            HealthState.UNHEALTHY
    await streams[0].aclose()
    assert health.streams == 2
    await health.close()


async def test_a_refresh_sends_the_new_device_names(feed):
    names = dict(NAMES)
    health = broadcaster(feed, names)
    stream = health.watch()
    await anext(stream)
    del names["fpga-2"]
    await health.refresh()
    assert [r.device for r in await asyncio.wait_for(anext(stream), 1)] == ["fpga-0", "fpga-1"]
    await health.close()


async def test_close_ends_every_stream(feed):
    health = broadcaster(feed)
    stream = health.watch()
    await anext(stream)
    waiting = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.05)
    await health.close()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(waiting, 1)


async def test_the_streams_end_with_the_feed(feed):
    health = broadcaster(feed)
    stream = health.watch()
    await anext(stream)
    await feed.close()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(stream), 1)
