"""1,000 claims in one NodePrepareResources call: that a call's cost grows with its claims,
not with their square.

A kubelet sends all of a pod's claims for one driver in one call; a pod of 1,000 claims is
far beyond any real one, which is the point: work done per claim against every other claim
of the call (a list scanned per claim, a checkpoint written per claim) shows here long
before it shows in a pod. The real ``serve --api dra`` and the reference driver
(:mod:`bench.dra_world`) each get :data:`SMALL` and then :data:`CLAIMS` new claims of one
device in one call, then all are unprepared in one call, :data:`ROUNDS` times, taking
turns; timed kubelet-side. The cost per claim of the two sizes tells the shape.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path

from bench.dra_world import DRIVER, REFERENCE, DraWorld, dra_world
from bench.table import Row, median, ms
from compat_tests.fake_sysfs import build_intel_node

CLAIMS = 1000
SMALL = 100
ROUNDS = 3
PORTS = 6


async def _rounds(world: DraWorld, count: int) -> dict[str, dict[str, list[float]]]:
    devices = sorted(world.published())
    dra = world.kubelet.dra
    assert dra is not None
    figures = {name: {"prepare": [], "unprepare": []} for name in ("ours", "reference")}
    drivers = [("ours", DRIVER), ("reference", REFERENCE)]
    for round_ in range(ROUNDS):
        for name, driver in drivers if round_ % 2 == 0 else drivers[::-1]:  # taking turns
            claims = [world.claim(f"{name}-{count}-{round_}-{n}", driver,
                                  devices[n % len(devices)]) for n in range(count)]
            began = time.perf_counter()
            outcome = await dra.prepare(claims)
            figures[name]["prepare"].append(time.perf_counter() - began)
            if not outcome.ok or not all(outcome.result(c.uid).ok for c in claims):
                raise RuntimeError(f"{name}: a claim of the call failed: {outcome.error}")
            began = time.perf_counter()
            outcome = await dra.unprepare(claims)
            figures[name]["unprepare"].append(time.perf_counter() - began)
            if not outcome.ok:
                raise RuntimeError(f"{name}: the unprepare call failed: {outcome.error}")
    return figures


def run() -> list[Row]:
    root = Path(tempfile.mkdtemp(prefix="dpbatch", dir="/tmp"))
    try:
        node = build_intel_node(root / "node")
        (root / "world").mkdir()

        async def measured() -> tuple[dict[str, dict[str, list[float]]], ...]:
            async with dra_world(root / "world", node, PORTS, root / "serve.stderr") as world:
                return await _rounds(world, SMALL), await _rounds(world, CLAIMS)

        small, figures = asyncio.run(measured())
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ours, reference = figures["ours"], figures["reference"]
    ratio = median(ours["prepare"]) / median(reference["prepare"])
    per_claim = median(ours["prepare"]) / CLAIMS
    small_per_claim = median(small["ours"]["prepare"]) / SMALL
    return [
        Row(f"DRA prepare, {CLAIMS} claims in one call, ours / reference",
            f"{ms(median(ours['prepare']))} / {ms(median(reference['prepare']))}", "",
            f"median of {ROUNDS} calls each, kubelet-side, new claims of one port each; "
            f"{ratio:.2f}x the reference; {ms(per_claim)} a claim, against "
            f"{ms(small_per_claim)} a claim in calls of {SMALL} "
            f"({per_claim / small_per_claim:.2f}x)"),
        Row(f"DRA unprepare, {CLAIMS} claims in one call, ours / reference",
            f"{ms(median(ours['unprepare']))} / {ms(median(reference['unprepare']))}", "",
            f"median of {ROUNDS}; each call unprepares the claims the call above prepared"),
    ]
