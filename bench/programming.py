"""Programming at prepare, as the kubelet feels it: the fast path against prepare today.

The real ``serve --api dra --programming on`` in :mod:`bench.dra_world` (the reference driver
registered beside it, idle): an emulated 1.36 API server (HTTPS, its own CA, as in a pod)
and an emulated 1.36 kubelet, on a fake node of six Intel ports, with
the stand-in ``fpgaconf`` (:mod:`compat_tests.fake_fpga_tools`: it parses the GBS and
rewrites the port's ``afu_id``) made to take a fixed time per load. Three kinds of claims,
taking turns claim by claim in the same process, each prepared by its own
NodePrepareResources and unprepared before the next:

- today: a claim with no configuration (what every claim was before functions existed);
- fast path: a claim whose class configuration names nlb0, which the port holds already:
  the configuration parsed, the image's header checked (remembered per file version), the
  port's function read, nothing loaded;
- pinned fast path: the same, its configuration pinning nlb0's bytes with ``sha256``: the
  digest is remembered per file version, so this too is a ``stat``;
- load: a claim naming the other function than the port holds, so every one loads: the
  figure is the prepare time, and what it adds over the tool's fixed time.

Both fast paths must cost at most 5 % over today. Beside them, the first hash of a 400 MiB
image (what the first claim pinning a freshly copied image pays, once per file version, on a
worker thread) and a remembered one, through the driver's own :class:`ImageChecks`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.dra_world import DRIVER, NAMESPACE, NODE, dra_world
from bench.table import Row, median, ms, p50_p99
from compat_tests.apiserver import ApiServerEmulator, objects
from compat_tests.fake_fpga_tools import write_stand_in_tools
from compat_tests.fake_sysfs import DEFAULT_INTERFACE_ID, FakeNode, build_intel_node
from compat_tests.fpga_images import NLB0_AFU_ID, NLB3_AFU_ID, build_gbs, write_image
from compat_tests.kubelet import KubeletEmulator
from compat_tests.kubelet.dra_results import ClaimRef
from plugin.programming.ids import dashed
from plugin.programming.image_checks import ImageChecks
from plugin.programming.library import ImageLibrary

CLAIMS = 400
WARM_UP = 50
LOADS = 20
TOOL_DELAY = 0.2
"""Seconds each stand-in load takes (a real partial reconfiguration takes one to a few)."""
FAST_PORT = "pci-0000-be-00-1"
"""A virtual function's port: it holds nlb0 and cannot be loaded, so only the fast path runs."""
LOAD_PORT = "pci-0000-5e-00-0"
"""Port 0 of an OPAE card: fpgaconf loads it."""
BIG_IMAGE = 400 * 1024 * 1024
HASHES = 3




def _config(afu: str, image: str, sha256: str | None = None) -> dict[str, Any]:
    pin = {"sha256": sha256} if sha256 else {}
    return {"source": "FromClass", "requests": ["fpga"], "opaque": {"driver": DRIVER,
            "parameters": {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "FpgaFunction",
                           "afuID": afu, "image": image, **pin}}}


@dataclass
class World:
    api: ApiServerEmulator
    kubelet: KubeletEmulator
    count: int = 0

    def claim(self, device: str, *config: dict[str, Any]) -> ClaimRef:
        self.count += 1
        name = f"claim-{self.count}"
        self.api.create_claim(NAMESPACE, name, [("fpga", DRIVER)])
        obj = self.api.set_claim_status(NAMESPACE, name, {"allocation": objects.allocation(
            [objects.result("fpga", DRIVER, NODE, device)], node_name=NODE, config=config)})
        return ClaimRef(NAMESPACE, name, obj["metadata"]["uid"], (DRIVER,))

    async def prepare_and_release(self, ref: ClaimRef) -> float:
        dra = self.kubelet.dra
        assert dra is not None
        began = time.perf_counter()
        outcome = await dra.prepare([ref])
        took = time.perf_counter() - began
        result = outcome.result(ref.uid)
        if not result.ok:
            raise RuntimeError(f"claim {ref.name} failed: {result.error}")
        await dra.unprepare([ref])
        return took


@contextlib.asynccontextmanager
async def _world(root: Path, node: FakeNode) -> AsyncIterator[World]:
    """:func:`bench.dra_world.dra_world` with programming on: an image library holding nlb0
    and nlb3, and the stand-in ``fpgaconf`` taking :data:`TOOL_DELAY` per load."""
    library = root / "images"
    for afu, name in ((NLB0_AFU_ID, "nlb0.gbs"), (NLB3_AFU_ID, "nlb3.gbs")):
        write_image(library, name, build_gbs(afu_ids=(afu,),
                                             interface_id=dashed(DEFAULT_INTERFACE_ID)))
    tools = write_stand_in_tools(root / "tools", node, delay=TOOL_DELAY)
    flags = ("--programming", "on", "--intel-loader", "fpgaconf",
             "--fpgaconf", str(tools.fpgaconf), "--image-library", str(library))
    async with dra_world(root, node, 6, root / "serve.stderr", serve=("-m", "plugin"),
                         flags=flags) as world:
        yield World(world.api, world.kubelet)


async def _measure(root: Path, node: FakeNode) -> dict[str, list[float]]:
    figures: dict[str, list[float]] = {"today": [], "fast": [], "pinned": [], "load": []}
    nlb0 = _config(NLB0_AFU_ID, "nlb0.gbs")
    async with _world(root, node) as world:
        digest = hashlib.sha256((root / "images" / "nlb0.gbs").read_bytes()).hexdigest()
        pinned = _config(NLB0_AFU_ID, "nlb0.gbs", digest)
        for n in range(WARM_UP + CLAIMS):
            kinds = [("today", ()), ("fast", (nlb0,)), ("pinned", (pinned,))]
            kinds = kinds[n % 3:] + kinds[:n % 3]
            for kind, config in kinds:
                took = await world.prepare_and_release(world.claim(FAST_PORT, *config))
                if n >= WARM_UP:
                    figures[kind].append(took)
        for n in range(LOADS):
            afu, image = (NLB3_AFU_ID, "nlb3.gbs") if n % 2 == 0 else (NLB0_AFU_ID, "nlb0.gbs")
            figures["load"].append(await world.prepare_and_release(
                world.claim(LOAD_PORT, _config(afu, image))))
    return figures


async def _hashes(root: Path) -> tuple[list[float], list[float]]:
    """First hashes of a 400 MiB image (each a new file version), then remembered ones."""
    library = root / "big"
    library.mkdir()
    image = library / "big.gbs"
    block = os.urandom(1024 * 1024)
    with image.open("wb") as out:
        for _ in range(BIG_IMAGE // len(block)):
            out.write(block)
    checks = ImageChecks(ImageLibrary(library, max_bytes=BIG_IMAGE))
    first, again = [], []
    for n in range(HASHES):
        os.utime(image, ns=(n, n))  # a new file version: hashed again
        began = time.perf_counter()
        await checks.digest("big.gbs")
        first.append(time.perf_counter() - began)
        for _ in range(50):
            began = time.perf_counter()
            await checks.digest("big.gbs")
            again.append(time.perf_counter() - began)
    return first, again


def run() -> list[Row]:
    root = Path(tempfile.mkdtemp(prefix="dpprog", dir="/tmp"))
    try:
        node = build_intel_node(root / "node")
        figures = asyncio.run(_measure(root, node))
        first_hash, remembered = asyncio.run(_hashes(root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    today, fast, load = figures["today"], figures["fast"], figures["load"]
    pinned = figures["pinned"]
    ratio = median(fast) / median(today)
    pinned_ratio = median(pinned) / median(today)
    return [
        Row("DRA prepare today (no function named), p50 / p99",
            p50_p99(today), "",
            f"{CLAIMS} claims of one port, one NodePrepareResources each, kubelet-side, "
            "interleaved with the row below; serve --api dra --programming on"),
        Row("DRA prepare, function held already (fast path), p50 / p99",
            p50_p99(fast), "",
            "class configuration FpgaFunction nlb0 on a port holding nlb0: parsed, the GBS "
            "header checked (remembered per file version), nothing loaded"),
        Row("DRA prepare, fast path / today (p50)", f"{ratio:.3f}x", "<= 1.05x",
            f"{'met' if ratio <= 1.05 else 'NOT met'}; what naming a function costs when "
            "nothing is loaded"),
        Row("DRA prepare, pinned image held already (fast path), p50 / p99",
            p50_p99(pinned), "",
            "the same with sha256 pinning nlb0's bytes: the digest remembered per file "
            "version"),
        Row("DRA prepare, pinned fast path / today (p50)", f"{pinned_ratio:.3f}x", "<= 1.05x",
            f"{'met' if pinned_ratio <= 1.05 else 'NOT met'}; what pinning costs when "
            "nothing is loaded"),
        Row("first sha256 of a 400 MiB image, p50", ms(median(first_hash)), "",
            f"{HASHES} file versions, through ImageChecks (library open, pread in 1 MiB "
            f"chunks, a worker thread), page cache warm; "
            f"{BIG_IMAGE / median(first_hash) / 2**20:.0f} MiB/s"),
        Row("sha256 of an unchanged image (remembered), p50", ms(median(remembered)), "",
            "one stat of the file, compared with the version hashed"),
        Row("DRA prepare with a load, p50", ms(median(load)), "",
            f"{LOADS} claims alternating nlb3/nlb0 on one port, every one loaded by the "
            f"stand-in fpgaconf taking {TOOL_DELAY * 1000:.0f} ms (plus its own start-up), "
            "answered once discovery reads the new afu_id; "
            f"{ms(median(load) - TOOL_DELAY)} over the tool's fixed time"),
    ]


if __name__ == "__main__":
    from bench.table import render

    print(render(run()))
