"""Where a DRA prepare's time goes inside ``serve``: stage timers in an unmodified copy.

``python -m bench.dra_breakdown [CLAIMS] [--no-fsync] [--held]`` runs the claim loop of
:mod:`bench.dra` (ours and the reference taking turns, 400 claims each by default) with both
processes started through this module's shim, which wraps some functions with wall-clock
timers and then runs ``python -m plugin`` (or the reference) as it is: nothing under
``plugin/`` is edited, and the figures are what the process measured on itself. It prints
the kubelet-side medians, the CPU each process spent per prepare + unprepare (every thread,
from ``/proc/PID/task/*/stat``) and the mean time of each stage per call. Timers cost a few
microseconds a call; stages nest (``commit`` holds ``_append_line``).

``--no-fsync`` also makes ``os.fsync`` a no-op in ``serve``: what durability costs.
``--held`` then prepares CLAIMS claims of ours without unpreparing any, and prints the
prepare latency by how many claims were already held: what the checkpoint costs as it grows.

Not a table row (no ``run()``): a tool for whoever changes the driver.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import inspect
import json
import os
import runpy
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.table import median

SHIM = "shim"
TOTALS: dict[str, list[float]] = {}
_LOCK = threading.Lock()


def _timed(owner: Any, attribute: str, label: str) -> None:
    original = getattr(owner, attribute)
    TOTALS[label] = [0, 0.0]  # printed in this order

    def add(began: float) -> None:
        with _LOCK:
            entry = TOTALS.setdefault(label, [0, 0.0])
            entry[0] += 1
            entry[1] += time.perf_counter() - began

    if inspect.iscoroutinefunction(original):
        @functools.wraps(original)
        async def wrapper(*args, **kwargs):
            began = time.perf_counter()
            try:
                return await original(*args, **kwargs)
            finally:
                add(began)
    else:
        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            began = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                add(began)
    setattr(owner, attribute, wrapper)


def _shim(out: str, what: str, no_fsync: bool, argv: list[str]) -> None:
    """Install the timers, then run ``serve`` or the reference as if started directly."""
    atexit.register(lambda: Path(out).write_text(json.dumps(TOTALS)))
    if what == "reference":
        from lightkube import AsyncClient

        _timed(AsyncClient, "get", "lightkube AsyncClient.get")
        sys.argv = ["bench.reference_dra_driver", *argv]
        runpy.run_module("bench.reference_dra_driver", run_name="__main__", alter_sys=True)
        return
    if no_fsync:
        os.fsync = lambda _fd: None
    import logging

    from api_versions import dra_plugin
    from plugin.serving.dra import apiserver, checkpoint, claim_cdi, driver, prepare

    stages = [
        (prepare.ClaimPreparer, "prepare", "ClaimPreparer.prepare (whole call)"),
        (prepare.ClaimPreparer, "unprepare", "ClaimPreparer.unprepare (whole call)"),
        (apiserver.ApiServer, "get_claim", "  ApiServer.get_claim (the GET)"),
        (driver, "parse_claim", "  parse_claim"),
        (claim_cdi.ClaimSpecs, "write", "  claim CDI spec write"),
        (claim_cdi.ClaimSpecs, "remove", "  claim CDI spec remove"),
        (checkpoint.ClaimCheckpoint, "commit", "  checkpoint commit (both calls)"),
        (checkpoint, "_append_line", "    checkpoint _append_line (event loop)"),
        (checkpoint, "_write_atomically", "    checkpoint rewrite (worker)"),
        (dra_plugin, "prepare_response", "prepare_response"),
        (logging.StreamHandler, "emit", "log line emitted"),
    ]
    for owner, attribute, label in stages:
        _timed(owner, attribute, label)
    sys.argv = ["plugin", *argv]
    runpy.run_module("plugin", run_name="__main__", alter_sys=True)


def _cpu_ns(pid: int) -> int:
    """User + system time of every live thread of ``pid``, in ns (10 ms ticks)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) * 10_000_000
    return total


async def _measure(root: Path, count: int, no_fsync: bool, held: bool) -> None:
    from bench.dra import PORTS, interleaved_claims
    from bench.dra_world import DRIVER, dra_world
    from compat_tests.fake_sysfs import build_intel_node

    node = build_intel_node(root / "node")
    (root / "dra").mkdir()
    flags = ("--no-fsync",) if no_fsync else ()
    ours_out, reference_out = root / "ours.json", root / "reference.json"
    serve = ("-m", "bench.dra_breakdown", SHIM, str(ours_out), "serve", *flags, "--")
    reference = ("-m", "bench.dra_breakdown", SHIM, str(reference_out), "reference", "--")
    async with dra_world(root / "dra", node, PORTS, root / "stderr", serve, reference) as world:
        pids = {"ours": world.serve.pid, "reference": world.reference.pid}
        if held:
            await _held(world, DRIVER, count)
            return
        await interleaved_claims(world, 50, 50, "warm-")
        before = {name: _cpu_ns(pid) for name, pid in pids.items()}
        figures = await interleaved_claims(world, count, 0)
        cpu = {name: (_cpu_ns(pid) - before[name]) / count / 1e6 for name, pid in pids.items()}
    for name in ("ours", "reference"):
        prepare, unprepare = figures[name]["prepare"], figures[name]["unprepare"]
        print(f"{name:9s} kubelet-side p50: prepare {median(prepare) * 1e3:6.2f} ms, unprepare "
              f"{median(unprepare) * 1e3:6.2f} ms; CPU per prepare + unprepare "
              f"{cpu[name]:5.2f} ms")
    ratio = median(figures["ours"]["prepare"]) / median(figures["reference"]["prepare"])
    print(f"prepare p50 ours / reference: {ratio:.2f}x{' (fsync off in serve)' * no_fsync}")
    for name, path in (("serve", ours_out), ("reference", reference_out)):
        print(f"{name}: mean per call (all calls, warm-up included)")
        for label, (calls, seconds) in json.loads(path.read_text()).items():
            if calls:
                print(f"  {label:46s} {seconds / calls * 1e3:7.3f} ms  ({int(calls)} calls)")


async def _held(world: Any, driver: str, count: int) -> None:
    devices = sorted(world.published())
    dra = world.kubelet.dra
    claims = [world.claim(f"held-{n}", driver, devices[n % len(devices)]) for n in range(count)]
    took = []
    for claim in claims:
        began = time.perf_counter()
        outcome = await dra.prepare([claim])
        took.append(time.perf_counter() - began)
        if not outcome.ok:
            raise RuntimeError(outcome.error)
    step = max(1, count // 10)
    for start in range(0, count, step):
        window = took[start:start + step]
        print(f"prepare with {start:4d}-{start + len(window) - 1:4d} claims already held: "
              f"p50 {median(window) * 1e3:7.2f} ms")
    checkpoint = world.root / "state" / "claims.jsonl"
    print(f"checkpoint file with {count} claims: {checkpoint.stat().st_size / 1024:.0f} KiB")


def main(argv: list[str]) -> None:
    if argv[:1] == [SHIM]:
        out, what, *rest = argv[1:]
        split = rest.index("--")
        _shim(out, what, "--no-fsync" in rest[:split], rest[split + 1:])
        return
    count = next((int(a) for a in argv if a.isdigit()), 400)
    root = Path(tempfile.mkdtemp(prefix="dpdrab", dir="/tmp"))
    try:
        asyncio.run(_measure(root, count, "--no-fsync" in argv, "--held" in argv))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
