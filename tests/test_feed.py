"""ListAndWatch semantics: the full list at once, again on each change, latest state wins."""

from __future__ import annotations

import asyncio

from plugin.model.feed import DeviceFeed
from value_types.devices import Device, DeviceSet


def snapshot(*ids: str) -> DeviceSet:
    return DeviceSet.of(Device(id=i, backend="units") for i in ids)


async def test_subscriber_gets_current_then_changes_and_ends_on_close() -> None:
    feed = DeviceFeed(snapshot("0"))
    seen: list[tuple[str, ...]] = []

    async def follow() -> None:
        async for devices in feed.subscribe():
            seen.append(devices.ids)

    task = asyncio.create_task(follow())
    await asyncio.sleep(0)
    assert await feed.publish(snapshot("0", "1"))
    assert not await feed.publish(snapshot("0", "1")), "an identical snapshot is not a change"
    await asyncio.sleep(0.01)
    await feed.close()
    await asyncio.wait_for(task, 1)
    assert seen == [("0",), ("0", "1")]


async def test_slow_subscriber_skips_to_latest() -> None:
    feed = DeviceFeed(snapshot("0"))
    stream = feed.subscribe()
    assert (await anext(stream)).ids == ("0",)
    for n in range(1, 5):
        await feed.publish(snapshot(*map(str, range(n + 1))))
    assert (await anext(stream)).ids == ("0", "1", "2", "3", "4")
    await feed.close()
