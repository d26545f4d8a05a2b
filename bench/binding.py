"""Loading before the pod binds (``--program-at bind``) against loading at prepare, end to end.

From a pod's creation to its container's start, for a pod whose function must be loaded: the
real ``serve --api dra --programming on`` in :mod:`bench.dra_world` (an emulated 1.36 API
server over HTTPS and an emulated 1.36 kubelet), a node of two OPAE cards, the stand-in
``fpgaconf`` taking :data:`LOAD` s per load (a small partial reconfiguration), and the
emulated 1.36 scheduler's PreBind (:class:`~compat_tests.apiserver.scheduler.
BindingScheduler`). One round: the pod's claim created, allocated by the scheduler (the
DeviceClass names the other function than the card holds, so every round loads), PreBind
waited on where the device carries binding conditions, the kubelet's NodePrepareResources
answered (the container would start then; no runtime here), the claim unprepared and
deleted. Both modes run in the same run, each in its own ``serve``:

- ``prepare``: PreBind has nothing to wait on; the load happens inside NodePrepareResources;
- ``bind``, the scheduler polling every 5 s (upstream's ``wait.PollUntilContextTimeout``
  interval, not configurable): the load happens while PreBind waits; the pod binds at the
  first poll after ``FunctionReady``, and prepare finds the function held;
- ``bind``, polling every 0.2 s: the same without most of the poll's rounding, to show what
  is the driver's and what is the poll's.

Then the rescheduling time: in ``bind`` mode with the first card's loads failing, from the
pod's creation to its container's start on the second card (a failed load, PreBind failing
at its next poll, the allocation cleared, a new one on the other card, a load there). The
emulated scheduler schedules again at once; a real one's queue adds its back-off (1 s for a
pod's first retry). After each such round the first card is loaded once with the tools
mended, so its quarantine ends and it is first again.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from bench.dra_world import DRIVER, NAMESPACE, NODE, dra_world
from bench.table import Row, median
from compat_tests.apiserver import ApiServerEmulator, objects
from compat_tests.apiserver.scheduler import POLL, BindingScheduler
from compat_tests.fake_fpga_tools import StandInTools, write_stand_in_tools
from compat_tests.fake_sysfs import DEFAULT_INTERFACE_ID, FakeNode
from compat_tests.fpga_images import NLB0_AFU_ID, NLB3_AFU_ID, build_gbs, write_image
from compat_tests.kubelet import KubeletEmulator
from compat_tests.kubelet.dra_results import ClaimRef
from plugin.programming.ids import dashed

LOAD = 1.0
"""Seconds each stand-in load takes."""
ROUNDS = 4
MOVES = 3
FAST_POLL = 0.2
CARDS = ("0000:5e:00.0", "0000:af:00.0")
"""Two OPAE cards, one port each; the allocator takes the first free, untainted one."""
FIRST, SECOND = "pci-0000-5e-00-0", "pci-0000-af-00-0"
SPARE_AFU = "0123456789abcdef0123456789abcdef"
"""What both cards hold at first: neither function, so every round loads."""
FUNCTIONS = {"nlb3": (NLB3_AFU_ID, "nlb3.gbs"), "nlb0": (NLB0_AFU_ID, "nlb0.gbs")}


def _function(afu: str, image: str) -> dict[str, object]:
    return {"opaque": {"driver": DRIVER, "parameters": {
        "apiVersion": f"{DRIVER}/v1alpha1", "kind": "FpgaFunction", "afuID": afu,
        "image": image}}}


@dataclass
class World:
    root: Path
    api: ApiServerEmulator
    kubelet: KubeletEmulator
    node: FakeNode
    tools_now: StandInTools
    count: int = 0
    holds: dict[str, str] = field(default_factory=dict)
    """Device -> the function it was last given here."""

    def other(self, device: str) -> str:
        """A function ``device`` does not hold: a claim of it must be loaded."""
        return "nlb0" if self.holds.get(device) == "nlb3" else "nlb3"

    def tools(self, fail_at: tuple[str, ...] = ()) -> StandInTools:
        """The stand-in tools (re)written: each load takes :data:`LOAD` s, failing on the
        cards of ``fail_at``."""
        return write_stand_in_tools(self.root / "tools", self.node, delay=LOAD,
                                    fail_at=fail_at)

    def loads(self) -> int:
        return len(self.tools_now.invocations("fpgaconf"))

    async def pod(self, poll: float, function: str, attempts: int = 1) -> float:
        """Seconds from the pod's claim created to its NodePrepareResources answered."""
        self.count += 1
        name = f"pod-{self.count}"
        loads = self.loads()
        began = time.perf_counter()
        self.api.create_claim(NAMESPACE, name, [("fpga", function)])
        outcome = await BindingScheduler(self.api, poll=poll, binding_timeout=60.0).schedule(
            NAMESPACE, f"{name}-pod", name, NODE, attempts=attempts)
        if not outcome.bound or outcome.attempts != attempts:
            raise RuntimeError(f"{name}: {outcome}")
        self.holds[outcome.devices[-1]] = function
        stored = self.api.get("resourceclaims", name, NAMESPACE)
        assert stored is not None
        ref = ClaimRef(NAMESPACE, name, stored["metadata"]["uid"], (DRIVER,))
        took = await self._prepared(ref) - began
        if self.loads() - loads != attempts:
            raise RuntimeError(f"{name}: {self.loads() - loads} load(s), not {attempts}")
        await self._release(ref)
        return took

    async def _prepared(self, ref: ClaimRef) -> float:
        dra = self.kubelet.dra
        assert dra is not None
        result = (await dra.prepare([ref])).result(ref.uid)
        if not result.ok:
            raise RuntimeError(f"{ref.name}: {result.error}")
        return time.perf_counter()

    async def _release(self, ref: ClaimRef) -> None:
        assert self.kubelet.dra is not None
        await self.kubelet.dra.unprepare([ref])
        self.api.delete("resourceclaims", ref.name, NAMESPACE)

    async def load(self, device: str, function: str) -> None:
        """A load that succeeds on ``device``, allocated by hand (no scheduler picks a
        tainted device) and given at prepare: a quarantine of the device ends."""
        self.tools()
        self.count += 1
        name = f"load-{self.count}"
        self.api.create_claim(NAMESPACE, name, [("fpga", DRIVER)])
        afu, image = FUNCTIONS[function]
        obj = self.api.set_claim_status(NAMESPACE, name, {"allocation": objects.allocation(
            [objects.result("fpga", DRIVER, NODE, device)], node_name=NODE,
            config=[{"source": "FromClass", "requests": ["fpga"],
                     **_function(afu, image)}])})
        ref = ClaimRef(NAMESPACE, name, obj["metadata"]["uid"], (DRIVER,))
        await self._prepared(ref)
        await self._release(ref)
        self.holds[device] = function
        while self._tainted(device):
            await asyncio.sleep(0.02)

    def _tainted(self, device: str) -> bool:
        return any(d.get("taints") for s in self.api.list("resourceslices")
                   if s["spec"]["nodeName"] == NODE
                   for d in s["spec"].get("devices", []) if d["name"] == device)


@contextlib.asynccontextmanager
async def _world(root: Path, mode: str) -> AsyncIterator[World]:
    node = FakeNode(root / "node")
    for bdf in CARDS:
        node.add_opae_card(bdf, afu_id=SPARE_AFU)
    library = root / "images"
    for afu, image in FUNCTIONS.values():
        write_image(library, image, build_gbs(afu_ids=(afu,),
                                              interface_id=dashed(DEFAULT_INTERFACE_ID)))
    tools = write_stand_in_tools(root / "tools", node, delay=LOAD)
    flags = ("--programming", "on", "--program-at", mode, "--intel-loader", "fpgaconf",
             "--fpgaconf", str(tools.fpgaconf), "--image-library", str(library),
             "--program-timeout", "30")
    async with dra_world(root, node, len(CARDS), root / "serve.stderr", serve=("-m", "plugin"),
                         flags=flags) as world:
        for name, (afu, image) in FUNCTIONS.items():
            world.api.create_device_class(name, driver=DRIVER, spec={
                "selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}],
                "config": [_function(afu, image)]})
        yield World(root, world.api, world.kubelet, node, tools)


async def _rounds(world: World, poll: float, rounds: int) -> list[float]:
    return [await world.pod(poll, world.other(FIRST)) for _ in range(rounds)]


async def _measure(root: Path) -> dict[str, list[float]]:
    figures: dict[str, list[float]] = {}
    async with _world(root / "prepare", "prepare") as world:
        figures["prepare"] = await _rounds(world, POLL, ROUNDS)
    async with _world(root / "bind", "bind") as world:
        figures["bind"] = await _rounds(world, POLL, ROUNDS)
        figures["bind-fast"] = await _rounds(world, FAST_POLL, ROUNDS)
        figures["move"] = []
        for _ in range(MOVES):
            function = world.other(FIRST)
            if world.holds.get(SECOND) == function:  # the second card must load it too
                await world.load(SECOND, world.other(SECOND))
            world.tools(fail_at=(CARDS[0],))
            figures["move"].append(await world.pod(POLL, function, attempts=2))
            await world.load(FIRST, function)  # its quarantine ends: first again
    return figures


def run() -> list[Row]:
    root = Path(tempfile.mkdtemp(prefix="dpbind", dir="/tmp"))
    try:
        for mode in ("prepare", "bind"):
            (root / mode).mkdir()
        figures = asyncio.run(_measure(root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    prepare, bind = median(figures["prepare"]), median(figures["bind"])
    fast, move = median(figures["bind-fast"]), median(figures["move"])
    return [
        Row("pod created -> container start, --program-at prepare, p50", f"{prepare:.2f} s", "",
            f"{ROUNDS} pods, each loaded by a stand-in fpgaconf of {LOAD:.0f} s at "
            "NodePrepareResources; the emulated 1.36 scheduler binds at once"),
        Row("pod created -> container start, --program-at bind (5 s poll), p50",
            f"{bind:.2f} s", "",
            f"{ROUNDS} pods, the load during PreBind; the scheduler checks at once, then "
            f"every {POLL:.0f} s (upstream's), so the pod binds at the first poll after the "
            f"load: {bind / prepare:.1f}x prepare's"),
        Row("pod created -> container start, --program-at bind (0.2 s poll), p50",
            f"{fast:.2f} s", "",
            f"the same with the scheduler polling every {FAST_POLL} s: "
            f"{bind - fast:.2f} s of the row above is the 5 s poll's rounding"),
        Row("pod created -> container start on a 2nd card after a failed load, p50",
            f"{move:.2f} s", "",
            f"{MOVES} pods, --program-at bind, 5 s poll: a {LOAD:.0f} s load failing on the "
            "first card, PreBind failed at its next poll, the allocation cleared, a load on "
            "the second card (no scheduling-queue back-off emulated); with prepare the pod "
            "never moves"),
    ]


if __name__ == "__main__":
    from bench.table import render

    print(render(run()))
