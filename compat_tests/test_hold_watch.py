"""HoldWatch against an emulated kubelet's PodResources: a failure never releases a device."""

from __future__ import annotations

import asyncio
import contextlib

from api_versions.podresources import Listing
from compat_tests.kubelet.podresources import NodePods, PodContainer, PodResourcesServer
from plugin.model.held import DEVICE_PLUGIN, Held, still_held_through_device_plugin
from plugin.serving.holds import HoldWatch

RESOURCE = "b-com.com/accelerator"


async def compute(listing: Listing | None, before: Held) -> Held:
    """What the driver computes for its node (the rule under test), for these two devices."""
    return still_held_through_device_plugin(listing, before, {RESOURCE}, {"a", "b"})


async def test_a_kubelet_restarting_while_a_device_is_held_keeps_it_held(sockdir):
    pods = NodePods(sockdir)
    pods.add(PodContainer("ns", "p", "c", {RESOURCE: ["a"]}))
    socket = sockdir / "pr.sock"
    server = PodResourcesServer(36, socket, pods, dra_enabled=True)
    await server.start()
    changes: list[Held] = []
    said: list[str] = []
    watch = HoldWatch(socket, DEVICE_PLUGIN, compute, changes.append, said.append,
                      timeout=0.5, interval=0.02)
    assert list((await watch.first()).devices) == ["a"]
    assert len(said) == 1 and "pod ns/p container c" in said[0]
    running = asyncio.create_task(watch.run())
    try:
        await server.stop()  # the kubelet restarts: no socket for a while
        pods.end("ns", "p")  # and the pod ends meanwhile
        await asyncio.sleep(0.3)
        assert watch.held and changes == [], "a failed read released the device"
        server = PodResourcesServer(36, socket, pods, dra_enabled=True)
        await server.start()
        await asyncio.wait_for(running, 10)
        assert [dict(h.devices) for h in changes] == [{}]
        assert len(said) == 1, "said once per move, not per release"
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        await server.stop()
