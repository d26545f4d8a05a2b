"""DRA as a node feels it: claims prepared, slices put back, memory, against a floor.

The real ``serve --api dra`` between an emulated 1.36 API server and an emulated 1.36 kubelet
(:mod:`bench.dra_world`), beside :mod:`bench.reference_dra_driver`: the same gRPC stack and
API client, one claim GET per claim and a canned answer. Measured from the kubelet's side,
over the one grpc.aio channel it keeps per registered driver:

- claims: 1000 per driver, one device each, every one its own NodePrepareResources call, the
  drivers taking turns claim by claim (order rotating). Pods come and go as on a node: each of
  the six ports is held by one claim at a time, so the claim that had a port is unprepared
  (its own NodeUnprepareResources call, also timed) just before the next one takes it;
- slices: a port hot-plugged into the fake sysfs tree, time until the API server's store holds
  it (untainted) in the node's slices; and a kubelet start wiping the node's slices (the
  DeleteCollection every kubelet does), time from the store losing the last one to every
  device being back;
- memory: VmRSS of ``serve --api dra`` after all that, and of ``serve --api device-plugin``
  on the same node and backend after 1000 Allocates from an emulated 1.26 kubelet. Both run
  under ``-X importtime``: the device plugin must never import the API client (lightkube and
  its httpx2), and ``/proc/PID/maps`` must not hold the one shared object of that stack
  (msgspec's); the DRA process, which must, shows that the check can see them.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.dra_world import DRIVER, REFERENCE, DraWorld, dra_world
from bench.serving import serve_command
from bench.serving import stop as _stop
from bench.table import Row, median, ms, p50_p99
from compat_tests.fake_sysfs import CRASHED_AFU_ID, DEFAULT_AFU_ID, FakeNode, build_intel_node
from compat_tests.kubelet import KubeletEmulator
from compat_tests.kubelet.dra_results import ClaimRef

CLAIMS = 1000
WARM_UP = 100
PORTS = 6
HOTPLUG_ROUNDS = 10
RESTARTS = 10
ALLOCATIONS = 1000
RESOURCE = "b-com.com/accelerator"
HOTPLUGGED = "0000:5e:00.0"
CLIENT_MODULES = ("lightkube", "httpx2", "msgspec")
CLIENT_SHARED_OBJECT = "msgspec/_core"


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def _client_loaded(pid: int, stderr: Path) -> list[str]:
    """What of the API client stack process ``pid`` imported (its ``-X importtime`` lines
    in ``stderr``) or mapped (``/proc/PID/maps``)."""
    imported = set()
    for line in stderr.read_text(errors="replace").splitlines():
        if line.startswith("import time:"):
            module = line.rpartition("|")[2].strip()
            if module.split(".")[0] in CLIENT_MODULES:
                imported.add(module.split(".")[0])
    mapped = CLIENT_SHARED_OBJECT in Path(f"/proc/{pid}/maps").read_text()
    return sorted(imported) + ([f"{CLIENT_SHARED_OBJECT} .so"] if mapped else [])


async def interleaved_claims(world: DraWorld, count: int = CLAIMS, warm_up: int = WARM_UP,
                  tag: str = "") -> dict[str, dict[str, list[float]]]:
    """Prepare and unprepare figures of each driver, taking turns claim by claim."""
    devices = sorted(world.published())
    drivers = {"ours": DRIVER, "reference": REFERENCE}
    claims = {name: [world.claim(f"{name}-{tag}{n}", driver, devices[n % len(devices)])
                     for n in range(warm_up + count)] for name, driver in drivers.items()}
    figures = {name: {"prepare": [], "unprepare": []} for name in drivers}
    names = list(drivers)
    dra = world.kubelet.dra
    assert dra is not None
    for n in range(warm_up + count):
        for name in names[n % len(names):] + names[:n % len(names)]:
            if n >= len(devices):
                gone = claims[name][n - len(devices)]
                began = time.perf_counter()
                outcome = await dra.unprepare([gone])
                took = time.perf_counter() - began
                _check(outcome.ok, name, gone, outcome.error)
                if n >= warm_up:
                    figures[name]["unprepare"].append(took)
            claim = claims[name][n]
            began = time.perf_counter()
            outcome = await dra.prepare([claim])
            took = time.perf_counter() - began
            _check(outcome.ok and bool(outcome.cdi_ids(claim.uid)), name, claim, outcome.error)
            if n >= warm_up:
                figures[name]["prepare"].append(took)
    return figures


def _check(ok: bool, name: str, claim: ClaimRef, error: str | None) -> None:
    if not ok:
        raise RuntimeError(f"{name}: claim {claim.name} failed: {error}")


async def _hotplug(world: DraWorld) -> list[float]:
    """Time from a port's arrival in sysfs to its device in the node's slices."""
    figures = []
    port = next(p.name for p in world.node.ports.values() if p.bdf == HOTPLUGGED)
    everything = world.published()
    for _ in range(HOTPLUG_ROUNDS):
        world.node.remove_port(port)
        await world.timeline.until(lambda names: len(names) == len(everything) - 1,
                                   "the port gone from the slices")
        began = time.perf_counter()
        port = world.node.add_port(HOTPLUGGED)
        back = await world.timeline.until(lambda names: names == everything,
                                          "the port back in the slices")
        figures.append(back - began)
    return figures


async def _crashes(world: DraWorld) -> list[float]:
    """Time from a port's AFU crashing (no sysfs event: found by the health re-read) to its
    device tainted in the node's slices; the port recovers between rounds."""
    figures = []
    port = next(p.name for p in world.node.ports.values() if p.bdf == HOTPLUGGED)
    everything = world.published()
    for _ in range(HOTPLUG_ROUNDS):
        began = time.perf_counter()
        world.node.set_afu_id(port, CRASHED_AFU_ID)
        tainted = await world.timeline.until(lambda names: len(names) == len(everything) - 1,
                                             "the crashed port tainted in the slices")
        figures.append(tainted - began)
        world.node.set_afu_id(port, DEFAULT_AFU_ID)
        await world.timeline.until(lambda names: names == everything, "the port healthy again")
    return figures


async def _kubelet_starts(world: DraWorld) -> list[float]:
    """Time from a starting kubelet's wipe emptying the node's slices to all being back."""
    figures = []
    everything = world.published()
    for _ in range(RESTARTS):
        await world.restart_kubelet()
        wiped = await world.timeline.until(lambda names: not names, "the kubelet's wipe")
        back = await world.timeline.until(lambda names: names == everything, "slices back")
        figures.append(back - wiped)
        await world.registered()
    return figures


@dataclass
class DraFigures:
    claims: dict[str, dict[str, list[float]]]
    hotplug: list[float]
    crashes: list[float]
    starts: list[float]
    rss: float
    loaded: list[str]


async def _dra(root: Path, node: FakeNode) -> DraFigures:
    stderr = root / "dra-serve.stderr"
    async with dra_world(root, node, PORTS, stderr) as world:
        claims = await interleaved_claims(world)
        hotplug = await _hotplug(world)
        crashes = await _crashes(world)
        starts = await _kubelet_starts(world)
        return DraFigures(claims, hotplug, crashes, starts, _rss_mib(world.serve.pid),
                          _client_loaded(world.serve.pid, stderr))


async def _device_plugin(directory: Path, node: FakeNode) -> tuple[float, list[str]]:
    """VmRSS of ``serve --api device-plugin`` after 1000 Allocates, and what of the API
    client stack it loaded."""
    directory.mkdir()
    stderr = directory.parent / "dp-serve.stderr"
    command = serve_command(directory, "--log-level", "info", "--api", "device-plugin",
                            "--backend", "intel", "--sysfs-root", str(node.sysfs_root),
                            "--dev-root", str(node.dev_root))
    with open(stderr, "wb") as out:
        process = subprocess.Popen([command[0], "-X", "importtime", *command[1:]],
                                   stdout=subprocess.DEVNULL, stderr=out)
    try:
        async with KubeletEmulator(directory, "1.26") as kubelet:
            devices = sorted(await kubelet.wait_for_devices(
                RESOURCE, lambda d: len(d) == PORTS, timeout=30))
            for i in range(ALLOCATIONS):
                await kubelet.allocate(RESOURCE, [devices[i % len(devices)]])
            return _rss_mib(process.pid), _client_loaded(process.pid, stderr)
    finally:
        _stop(process)


def run() -> list[Row]:
    root = Path(tempfile.mkdtemp(prefix="dpdra", dir="/tmp"))
    try:
        node = build_intel_node(root / "node")
        dp_rss, dp_loaded = asyncio.run(_device_plugin(root / "dp", node))
        dra_root = root / "dra"
        dra_root.mkdir()
        figures = asyncio.run(_dra(dra_root, node))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    claims, hotplug, starts = figures.claims, figures.hotplug, figures.starts
    crashes = figures.crashes
    dra_rss, dra_loaded = figures.rss, figures.loaded

    def pair(name: str, what: str = "prepare") -> str:
        values = claims[name][what]
        return p50_p99(values)

    ratio = median(claims["ours"]["prepare"]) / median(claims["reference"]["prepare"])
    return [
        Row("DRA prepare, reference driver, p50 / p99", pair("reference"), "",
            f"{CLAIMS} claims of one device, one NodePrepareResources each, kubelet-side, "
            "interleaved with the row below; bench/reference_dra_driver.py: same grpc.aio "
            "and lightkube, one claim GET, canned CDI ID, no checkpoint"),
        Row("DRA prepare, serve --api dra, p50 / p99", pair("ours"), "",
            "claim GET from the emulated 1.36 API server (HTTPS, its own CA, as in a pod), "
            "checks, claim CDI spec written (tmpfs, as /var/run/cdi), one checkpoint journal "
            "line (disk, no fsync); default log level; 1.36 kubelet, v1.DRAPlugin"),
        Row("DRA prepare, ours / reference (p50)", f"{ratio:.2f}x", "<= 1.2x",
            f"{'met' if ratio <= 1.2 else 'NOT met'}; what the driver adds over the floor"),
        Row("DRA unprepare p50, ours / reference",
            f"{ms(median(claims['ours']['unprepare']))} / "
            f"{ms(median(claims['reference']['unprepare']))}", "",
            f"{CLAIMS} calls each; a port's claim is unprepared before the next claim takes it "
            "(at most one claim per port prepared): one checkpoint journal line, claim spec "
            "removed"),
        Row("DRA slices: port hot-plugged -> in the API server", ms(median(hotplug)), "< 1 s",
            f"median of {HOTPLUG_ROUNDS}, max {ms(max(hotplug))}; sysfs change to the store "
            "committing the slice with the device untainted"),
        Row("DRA slices: AFU crash -> device tainted", ms(median(crashes)), "< 1 s",
            f"median of {HOTPLUG_ROUNDS}, max {ms(max(crashes))}; no sysfs event: the health "
            "re-read (serve's default --health-interval) finds it, to the store "
            "committing the slice with the device tainted"),
        Row("DRA slices: kubelet start wipe -> all back", ms(median(starts)), "< 1 s",
            f"median of {RESTARTS}, max {ms(max(starts))}; store empty of the node's slices "
            "(kubelet DeleteCollection) to every device published again"),
        Row("resident memory of serve, device plugin", f"{dp_rss:.1f} MiB", "",
            f"VmRSS after {ALLOCATIONS} Allocates, 1.26 kubelet, Intel backend, six ports; "
            f"API client loaded: {', '.join(dp_loaded) or 'none'} (-X importtime, "
            "/proc/PID/maps)"),
        Row("resident memory of serve, DRA", f"{dra_rss:.1f} MiB", "",
            f"VmRSS after the runs above, same node and backend; API client loaded: "
            f"{', '.join(dra_loaded) or 'none'}"),
        Row("memory DRA adds", f"{dra_rss - dp_rss:+.1f} MiB", "<= 15 MiB",
            f"{'met' if dra_rss - dp_rss <= 15 and not dp_loaded else 'NOT met'}; "
            "nothing when not used: the device plugin "
            + ("loads none of lightkube, httpx2, msgspec" if not dp_loaded
               else f"LOADS {', '.join(dp_loaded)}")),
    ]


if __name__ == "__main__":
    from bench.table import render

    print(render(run()))
