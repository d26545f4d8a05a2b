"""Shares of a device, as the kubelet feels them: what sharing's bookkeeping costs at prepare.

Two nodes of :mod:`bench.dra_world` side by side in this process, each its own emulated 1.36
API server (HTTPS, its own CA) and kubelet and its own real ``serve --api dra`` on a fake
node of six Intel ports, with the same flags (``--programming on``, an image library, the
stand-in ``fpgaconf``) but for one: the first runs with ``--dra-share intel=image``, the
second without. On the first, one claim naming a function whose GBS declares
:data:`CONTEXTS` contexts loads it onto :data:`SHARED_PORT` and is unprepared: from then on
the driver publishes that port shared (the image says how many users it serves), while a
port it did not load (:data:`WHOLE_PORT`) stays published whole.

Each round, every claim written allocated into the API server as a 1.36 scheduler leaves it
(a share: its own ``shareID`` and ``consumedCapacity``), and only the kubelet's
NodePrepareResources and NodeUnprepareResources calls are timed, one claim per call over the
kubelet's kept connection:

- the first share of the shared port (published shared, no share holds it), then
  :data:`SHARES` - 1 later shares (the others hold it already); then the shares unprepared,
  the last one (the one that would run a class's ``clearOnUnprepare``) after the others.
  Every other round a share of a second shared port (:data:`HELD_PORT`) is held throughout:
  without it, the port's first share is also the node's, which raises the claim
  checkpoint's header to major format 3 (a release before shares refuses that format: the
  rollback guard), and its last share rewrites the file whole as format 2;
- a claim with no configuration on the whole port of the sharing node (sharing on, the claim
  allocated whole), prepared and unprepared;
- the same on the node without sharing.

The two whole claims take their turns at a place among the share calls that moves from round
to round, so that drift on this shared machine hits every kind alike. A share must cost at
most 5 % over a whole claim of the same process, and a whole claim with sharing on at most 5 %
over one with sharing off.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.dra_world import DRIVER, NAMESPACE, NODE, PATIENCE, DraWorld, dra_world
from bench.table import Row, median, ms, percentile
from compat_tests.apiserver import objects
from compat_tests.fake_fpga_tools import write_stand_in_tools
from compat_tests.fake_sysfs import DEFAULT_INTERFACE_ID, build_intel_node
from compat_tests.fpga_images import NLB3_AFU_ID, build_gbs, write_image
from compat_tests.kubelet.dra_results import ClaimRef
from plugin.programming.ids import dashed

ROUNDS = 300
WARM_UP = 20
SHARES = 3
"""Shares prepared on the shared port each round: the first, then the later ones."""
CONTEXTS = 4
"""The contexts the loaded image declares (GBS ``total-contexts``): the port's count."""
SHARED_PORT = "pci-0000-5e-00-0"
"""Port 0 of an OPAE card: the stand-in ``fpgaconf`` loads it, so the driver knows its image."""
WHOLE_PORT = "pci-0000-be-00-1"
"""A virtual function's port holding an AFU the driver did not load: published whole."""
HELD_PORT = "pci-0000-3b-00-0"
"""A second port loaded and shared the same way: every other round one share of it is held
(untimed) from before the round's first share to after its last, so that the claim
checkpoint records a share throughout: its major format stays 3, and the first share of
:data:`SHARED_PORT` is recorded as one line like any other."""
IMAGE = "nlb3x4.gbs"
TARGET = 1.05
QUIET = 0.01
"""Seconds both API servers must have heard no request before a call is timed. Each call
leaves work behind (the driver writes the claim's status after answering) that this process,
which runs both API servers and kubelets, serves; without a pause the next call would pay
for it, whichever kind it is: a kubelet's calls for different pods seldom come back to back."""

KINDS = ("first", "held", "later", "whole", "off")
"""First share of the node (no share recorded anywhere), first share of the port while a share
of another port is held, later shares, whole claim with sharing on, with sharing off."""
OUT = ("last", "last held", "other", "whole", "off")
"""Unprepares: the port's last share (with another port's share held, or not), the others,
the whole claims."""


@dataclass
class Node:
    """One emulated node and its serve: claims written allocated, prepared and unprepared
    as its kubelet does, one claim per call, timed from the kubelet's side."""

    world: DraWorld
    count: int = 0
    all: list[DraWorld] = field(default_factory=list)
    """Every node of the run (this one among them), whose API servers must be quiet."""

    def claim(self, device: str, *, share: str | None = None,
              config: tuple[dict[str, Any], ...] = ()) -> ClaimRef:
        """A claim allocated ``device`` (a share of it with ID ``share``, of one context)."""
        self.count += 1
        name = f"claim-{self.count}"
        api = self.world.api
        api.create_claim(NAMESPACE, name, [("fpga", DRIVER)])
        extra: dict[str, Any] = {}
        if share is not None:
            extra = {"shareID": share, "consumedCapacity": {"contexts": "1"}}
        obj = api.set_claim_status(NAMESPACE, name, {"allocation": objects.allocation(
            [objects.result("fpga", DRIVER, NODE, device, **extra)], node_name=NODE,
            config=config)})
        return ClaimRef(NAMESPACE, name, obj["metadata"]["uid"], (DRIVER,))

    async def prepare(self, ref: ClaimRef, share: str | None = None) -> float:
        dra = self.world.kubelet.dra
        assert dra is not None
        await self.quiet()
        began = time.perf_counter()
        outcome = await dra.prepare([ref])
        took = time.perf_counter() - began
        result = outcome.result(ref.uid)
        if not result.ok:
            raise RuntimeError(f"claim {ref.name} not prepared: {result.error}")
        answered = {d.share_id for d in result.devices}
        if share is not None and answered != {share}:
            raise RuntimeError(f"share {share} of claim {ref.name} answered as {answered}")
        return took

    async def unprepare(self, ref: ClaimRef) -> float:
        dra = self.world.kubelet.dra
        assert dra is not None
        await self.quiet()
        began = time.perf_counter()
        outcome = await dra.unprepare([ref])
        took = time.perf_counter() - began
        if not outcome.ok:
            raise RuntimeError(f"claim {ref.name} not unprepared: {outcome.error}")
        return took

    async def quiet(self) -> None:
        """Until no API server of the run heard a request for :data:`QUIET` seconds."""
        heard = -1
        while heard != (heard := sum(len(n.api.requests) for n in self.all)):
            await asyncio.sleep(QUIET)

    def published_shared(self, device: str) -> int:
        """The contexts ``device`` is published shared with in the API server; 0: whole."""
        for obj in self.world.api.list("resourceslices"):
            for entry in obj["spec"].get("devices", []):
                if obj["spec"]["nodeName"] == NODE and entry["name"] == device:
                    if not entry.get("allowMultipleAllocations"):
                        return 0
                    return int(entry["capacity"]["contexts"]["value"])
        raise RuntimeError(f"device {device} is not published")


def _function(afu: str, image: str) -> dict[str, Any]:
    return {"source": "FromClass", "requests": ["fpga"], "opaque": {"driver": DRIVER,
            "parameters": {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "FpgaFunction",
                           "afuID": afu, "image": image}}}


@contextlib.asynccontextmanager
async def _node(root: Path, *share: str) -> AsyncIterator[Node]:
    """A node of six Intel ports and its serve (programming on, ``share`` flags added)."""
    root.mkdir()
    node = build_intel_node(root / "node")
    library = root / "images"
    write_image(library, IMAGE, build_gbs(
        afu_ids=(NLB3_AFU_ID,), interface_id=dashed(DEFAULT_INTERFACE_ID), contexts=CONTEXTS))
    tools = write_stand_in_tools(root / "tools", node)
    flags = ("--programming", "on", "--intel-loader", "fpgaconf",
             "--fpgaconf", str(tools.fpgaconf), "--image-library", str(library), *share)
    async with dra_world(root, node, 6, root / "serve.stderr", serve=("-m", "plugin"),
                         flags=flags) as world:
        yield Node(world)


async def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + PATIENCE
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not {what} within {PATIENCE:g} s")
        await asyncio.sleep(0.05)


async def _share_the_port(node: Node, port: str) -> None:
    """Load the function onto ``port`` through the driver, and release it: the port then
    holds a function whose image the driver knows, and is published shared."""
    loads = node.claim(port, config=(_function(NLB3_AFU_ID, IMAGE),))
    await node.prepare(loads)
    await node.unprepare(loads)
    await _until(lambda: node.published_shared(port) == CONTEXTS,
                 f"{port} published shared with {CONTEXTS} contexts")


Timed = Callable[[], Coroutine[Any, Any, None]]


async def _round(shared: Node, off: Node, prepared: dict[str, list[float]],
                 unprepared: dict[str, list[float]], turn: int) -> None:
    """One round: the shares' calls in order, the two whole claims at a place that moves;
    odd rounds with a share of :data:`HELD_PORT` held throughout."""
    refs: list[tuple[ClaimRef, str]] = []
    held = turn % 2 == 1

    def prepare_share(index: int) -> Timed:
        async def call() -> None:
            share = str(uuid.uuid4())
            ref = shared.claim(SHARED_PORT, share=share)
            refs.append((ref, share))
            kind = ("held" if held else "first") if index == 0 else "later"
            prepared[kind].append(await shared.prepare(ref, share))
        return call

    def unprepare_share(index: int) -> Timed:
        async def call() -> None:
            ref, _ = refs[index]
            kind = ("last held" if held else "last") if index == 0 else "other"
            unprepared[kind].append(await shared.unprepare(ref))
        return call

    def whole(node: Node, kind: str) -> Timed:
        async def call() -> None:
            ref = node.claim(WHOLE_PORT)
            prepared[kind].append(await node.prepare(ref))
            unprepared[kind].append(await node.unprepare(ref))
        return call

    calls = [prepare_share(i) for i in range(SHARES)]
    calls += [unprepare_share(i) for i in reversed(range(SHARES))]
    calls.insert(turn % (len(calls) + 1), whole(shared, "whole"))
    calls.insert((turn + len(calls) // 2) % (len(calls) + 1), whole(off, "off"))
    if held:
        anchor = str(uuid.uuid4())
        holder = shared.claim(HELD_PORT, share=anchor)
        await shared.prepare(holder, anchor)
    for call in calls:
        await call()
    if held:
        await shared.unprepare(holder)


async def _measure(root: Path, rounds: int, warm_up: int
                   ) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    prepared: dict[str, list[float]] = {k: [] for k in KINDS}
    unprepared: dict[str, list[float]] = {k: [] for k in OUT}
    async with _node(root / "shared", "--dra-share", "intel=image") as shared, \
            _node(root / "off") as off:
        shared.all = off.all = [shared.world, off.world]
        await _share_the_port(shared, SHARED_PORT)
        await _share_the_port(shared, HELD_PORT)
        if shared.published_shared(WHOLE_PORT):
            raise RuntimeError(f"{WHOLE_PORT} is published shared: no whole device to compare")
        for turn in range(warm_up):
            await _round(shared, off, {k: [] for k in KINDS},
                         {k: [] for k in unprepared}, turn)
        for turn in range(rounds):
            await _round(shared, off, prepared, unprepared, turn)
        if shared.world.serve.poll() is not None or off.world.serve.poll() is not None:
            raise RuntimeError("a serve process ended during the run")
    return prepared, unprepared


def _ratio(over: list[float], under: list[float]) -> float:
    return median(over) / median(under)


def _verdict(ratio: float) -> str:
    return "met" if ratio <= TARGET else "NOT met"


def rows(prepared: dict[str, list[float]], unprepared: dict[str, list[float]]) -> list[Row]:
    """The table of one run's figures (seconds per call, by kind)."""
    first, held, later, whole, off = (prepared[k] for k in KINDS)
    last, last_held, other, whole_out, off_out = (unprepared[k] for k in OUT)

    def p50_p90(values: list[float]) -> str:
        return f"{ms(median(values))} / {ms(percentile(values, 90))}"

    def versus(name: str, ratio: float, why: str) -> Row:
        return Row(name, f"{ratio:.3f}x", f"<= {TARGET}x", f"{_verdict(ratio)}; {why}")

    return [
        Row("DRA prepare, first share of a port, none on the node, p50 / p90",
            p50_p90(first), "",
            f"{len(first)} rounds; the port published shared with {CONTEXTS} contexts (its "
            "GBS's total-contexts), no share recorded on the node: the checkpoint's header "
            "is raised to format 3; serve --dra-share intel=image"),
        Row("DRA prepare, first share of a port, another port's share held, p50 / p90",
            p50_p90(held), "",
            f"{len(held)} rounds, taking turns with the row above: no share holds the port, "
            "the checkpoint stays format 3 (one journal line)"),
        Row("DRA prepare, later shares, p50 / p90", p50_p90(later), "",
            f"{SHARES - 1} a round, the earlier shares of the round holding the port"),
        Row("DRA prepare, whole claim, sharing on, p50 / p90", p50_p90(whole), "",
            "no configuration, on a port published whole (a function the driver did not "
            "load), same process, turns interleaved with the shares"),
        versus("DRA prepare, later share / whole claim, sharing on (p50)",
               _ratio(later, whole), "what a share's bookkeeping costs"),
        versus("DRA prepare, first share of a port / whole claim (p50)",
               _ratio(held, whole), "another port's share held"),
        versus("DRA prepare, first share on the node / whole claim (p50)",
               _ratio(first, whole), "the checkpoint's header raised to format 3 (that a "
               "release before shares refuses) on top"),
        Row("DRA prepare, whole claim, sharing off, p50 / p90", p50_p90(off), "",
            "the same claim on a second node whose serve has no --dra-share, same flags "
            "otherwise, turns interleaved"),
        versus("DRA prepare, whole claim, sharing on / off (p50)", _ratio(whole, off),
               "what turning sharing on costs a claim that is not a share"),
        Row("DRA unprepare p50, share (not last) / last share, none left on the node / "
            "last share, another held / whole on / whole off",
            " / ".join(ms(median(v)) for v in (other, last, last_held, whole_out, off_out)),
            "", "the last share on the node rewrites the checkpoint as format 2; a last share "
            "is the one a class's clearOnUnprepare would run for (none here)"),
        Row("DRA unprepare, share (not last) / whole claim, sharing on (p50)",
            f"{_ratio(other, whole_out):.3f}x", "",
            f"last share, another held / whole: {_ratio(last_held, whole_out):.3f}x; "
            f"whole, sharing on / off: {_ratio(whole_out, off_out):.3f}x"),
    ]


def run(rounds: int = ROUNDS, warm_up: int = WARM_UP) -> list[Row]:
    root = Path(tempfile.mkdtemp(prefix="dpshare", dir="/tmp"))
    try:
        prepared, unprepared = asyncio.run(_measure(root, rounds, warm_up))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rows(prepared, unprepared)


if __name__ == "__main__":
    from bench.table import render

    print(render(run()))
