"""A rolling update under DRA: the node's ResourceSlices stay as they are.

Two real ``serve --api dra`` processes (``maxSurge: 1``) against the emulated API server and a
1.36 kubelet: the new one starts while the old one serves and publishes, waits for the DRA
socket, and takes over when the old one stops. A scheduler reads the slices; a slice deleted
and created again in between is a window in which the node's devices cannot be allocated,
and churn every controller watching slices pays for. The request log of the API server
counts every write to ``resourceslices`` during the roll.
"""

from __future__ import annotations

import asyncio

from compat_tests.dra_support import until
from compat_tests.test_dra_serve import DRIVER, SETTLE, serve, world  # noqa: F401 (fixture)

WRITES = ("create", "update", "patch", "delete", "deletecollection")


def slice_writes(api) -> list[str]:
    return [f"{r.verb} {r.name}".strip() for r in api.requests
            if r.resource == "resourceslices" and r.verb in WRITES]


async def test_a_roll_neither_withdraws_nor_republishes_the_slices(world, sockdir,  # noqa: F811
                                                                   logdir, tmp_path):
    before = {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in world.slices()}
    assert before
    world.api.clear_requests()
    new = serve(sockdir, logdir, world.registry, world.fake, tmp_path / "kubeconfig",
                world.cdi, name="newcomer")
    await new.wait_for_log(lambda e: "Waiting for it to" in e.get("message", ""),
                           what="the newcomer saying it waits", timeout=SETTLE)
    assert await world.plugin.terminate() == 0
    world.plugin = new
    dra = world.kubelet.dra
    await dra.wait_until(lambda: dra.endpoints(DRIVER), SETTLE, "the newcomer registered")
    await until(lambda: len(world.device_names()) == 8, "eight ports published")
    await asyncio.sleep(2.0)  # a republish after the take-over would show by now

    assert slice_writes(world.api) == [], "slice churn during the roll"
    after = {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in world.slices()}
    assert after == before
