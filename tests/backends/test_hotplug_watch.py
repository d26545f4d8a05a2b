"""A port that appears or disappears reaches the device monitor through the backend's watched
directories alone: the periodic rescan is set far beyond the test's patience."""

from __future__ import annotations

import asyncio

from compat_tests.fake_sysfs import FakeNode
from plugin.discovery.backends.intel import IntelBackend
from plugin.discovery.monitor import DeviceMonitor
from value_types.devices import DeviceSet

PATIENCE = 30.0
NEVER = 3600.0


async def test_hot_plug_is_seen_without_waiting_for_the_rescan(intel_node: FakeNode) -> None:
    snapshots: asyncio.Queue[DeviceSet] = asyncio.Queue()

    async def publish(devices: DeviceSet) -> None:
        await snapshots.put(devices)

    monitor = DeviceMonitor(IntelBackend(intel_node.config()), rescan_interval=NEVER)
    task = asyncio.create_task(monitor.run(publish))
    try:
        first = await asyncio.wait_for(snapshots.get(), PATIENCE)
        assert "0000:5e:00.0" in first
        await asyncio.sleep(0.2)  # let the watches be set before changing the tree
        intel_node.remove_port("intel-fpga-port.0")
        after_removal = await asyncio.wait_for(snapshots.get(), PATIENCE)
        assert "0000:5e:00.0" not in after_removal
        intel_node.add_port("0000:5e:00.0")
        after_return = await asyncio.wait_for(snapshots.get(), PATIENCE)
        assert after_return.get("0000:5e:00.0") is not None
        assert after_return.get("0000:5e:00.0").healthy  # type: ignore[union-attr]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
