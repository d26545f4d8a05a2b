"""What the kubelet's probes cost the node per hour: exec ``healthcheck`` against HTTP.

The manifest's periods: liveness every 30 s and readiness every 15 s, so 120 + 240 = 360
probes an hour.

* exec: each probe starts ``accelerator-device-plugin healthcheck`` (the console script the
  manifest runs), a whole Python interpreter. CPU seconds (user + system) and peak RSS of
  each run come from the kernel's accounting of the child (``wait4``); medians of RUNS runs.
* HTTP: the running ``serve`` (``--probe-port``, units backend, held by an emulated 1.26
  kubelet, so ``/readyz`` answers 200 as on a healthy node) answers REQUESTS probes, each on
  a fresh connection as the kubelet's prober makes them (it disables keep-alive). The CPU
  is read from ``/proc/PID/stat`` (user + system of the whole process, the threads that
  ended included) before and after, less what the same process spends idle over as long;
  medians of ROUNDS rounds. The added memory is the median resident size of ``serve`` with
  ``--probe-port`` (after answering) less that of ``serve`` without it, STARTS starts each.
* idle: the probe thread's voluntary context switches over IDLE_SECONDS with no request: it
  blocks in ``select`` without a timeout, so an idle plugin is not woken by it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench.serving import spawn_units
from bench.serving import stop as _stop
from bench.table import Row, median
from compat_tests.kubelet import KubeletEmulator

LIVENESS_PERIOD = 30.0
READINESS_PERIOD = 15.0
PER_HOUR = {"/livez": 3600 / LIVENESS_PERIOD, "/readyz": 3600 / READINESS_PERIOD}
RUNS = 15
REQUESTS = 1500
ROUNDS = 5
STARTS = 3
IDLE_SECONDS = 10.0
SETTLE_SECONDS = 3.0
RESOURCE = "b-com.com/accelerator"
TICK = os.sysconf("SC_CLK_TCK")
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _healthcheck_command() -> list[str]:
    script = Path(sys.executable).with_name("accelerator-device-plugin")
    return [str(script)] if script.exists() else [sys.executable, "-m", "plugin"]


def exec_probe(heartbeat: Path) -> tuple[float, int]:
    """CPU seconds and peak RSS (KiB) of one ``healthcheck`` run."""
    process = subprocess.Popen(
        [*_healthcheck_command(), "healthcheck", "--heartbeat-file", str(heartbeat),
         "--heartbeat-max-age", "60"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    assert process.returncode == 0, "healthcheck failed on a fresh heartbeat"
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss


def cpu_seconds(pid: int) -> float:
    """User + system CPU of the whole process (ended threads included), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise ValueError("no VmRSS")


def probe_thread_switches(pid: int) -> int:
    for task in Path(f"/proc/{pid}/task").iterdir():
        if (task / "comm").read_text().strip() == "probe server":
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    return int(line.split()[1])
    raise ValueError("no probe thread")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def get(port: int, path: str) -> int:
    with DIRECT.open(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
        reply.read()
        return int(reply.status)


def http_cost(pid: int, port: int, path: str, idle_rate: float) -> float:
    """CPU seconds ``pid`` spends per ``path`` request, less its idle rate."""
    started, before = time.monotonic(), cpu_seconds(pid)
    for _ in range(REQUESTS):
        assert get(port, path) == 200
    spent = cpu_seconds(pid) - before - idle_rate * (time.monotonic() - started)
    return max(0.0, spent) / REQUESTS


async def _measure_http(directory: Path, with_probes: bool) -> dict[str, float]:
    port = free_port()
    flags = ["--probe-port", str(port), "--probe-address", "127.0.0.1"] if with_probes else []
    process = spawn_units(directory, 4, *flags)
    figures: dict[str, float] = {}
    try:
        async with KubeletEmulator(directory, "1.26") as kubelet:
            await kubelet.wait_for_devices(RESOURCE, lambda d: len(d) == 4, timeout=30)
            await asyncio.sleep(SETTLE_SECONDS)
            if not with_probes:
                figures["rss"] = rss_kib(process.pid)
                return figures
            before, switches = cpu_seconds(process.pid), probe_thread_switches(process.pid)
            await asyncio.sleep(IDLE_SECONDS)
            idle_rate = (cpu_seconds(process.pid) - before) / IDLE_SECONDS
            figures["idle switches"] = probe_thread_switches(process.pid) - switches
            for path in PER_HOUR:
                costs = [await asyncio.to_thread(http_cost, process.pid, port, path, idle_rate)
                         for _ in range(ROUNDS)]
                figures[path] = median(costs)
            figures["rss"] = rss_kib(process.pid)
    finally:
        _stop(process)
    return figures


def run() -> list[Row]:
    root = Path(tempfile.mkdtemp(prefix="dpprobe", dir="/tmp"))
    try:
        heartbeat = root / "heartbeat"
        heartbeat.write_text(f"{time.time():.3f}\n")
        exec_runs = [exec_probe(heartbeat) for _ in range(RUNS)]
        with_probes, without = [], []
        for start in range(STARTS):
            for figures, probes in ((with_probes, True), (without, False)):
                directory = root / f"{start}-{probes}"
                directory.mkdir()
                figures.append(asyncio.run(_measure_http(directory, probes)))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    exec_cpu = median([cpu for cpu, _ in exec_runs])
    exec_rss = median([float(rss) for _, rss in exec_runs])
    probes_per_hour = sum(PER_HOUR.values())
    exec_hour = exec_cpu * probes_per_hour
    http = {path: median([f[path] for f in with_probes]) for path in PER_HOUR}
    http_hour = sum(http[path] * PER_HOUR[path] for path in PER_HOUR)
    added_rss = median([f["rss"] for f in with_probes]) - median([f["rss"] for f in without])
    switches = max(f["idle switches"] for f in with_probes)

    def millicores(per_hour: float) -> str:
        return f"{per_hour / 3.6:.3f} millicores"

    return [
        Row("exec probe (healthcheck): CPU per run", f"{exec_cpu * 1000:.0f} ms", "",
            f"median of {RUNS}; a Python interpreter started each time"),
        Row("exec probe (healthcheck): peak RSS per run", f"{exec_rss / 1024:.1f} MiB", "",
            "on top of serve, while it runs; liveness and readiness can overlap"),
        Row("exec probes per hour (liveness 30 s + readiness 15 s)",
            f"{exec_hour:.1f} CPU s", "", f"{probes_per_hour:.0f} runs; "
            f"{millicores(exec_hour)}"),
        Row("HTTP /livez: serve CPU per request", f"{http['/livez'] * 1e6:.0f} µs", "",
            f"median of {ROUNDS} rounds of {REQUESTS}, a fresh connection each"),
        Row("HTTP /readyz: serve CPU per request", f"{http['/readyz'] * 1e6:.0f} µs", "",
            "includes the read on the event loop"),
        Row("HTTP probes per hour (same periods)", f"{http_hour:.3f} CPU s", "",
            f"{millicores(http_hour)}; {exec_hour / max(http_hour, 1e-9):.0f}x less than exec"),
        Row("HTTP probes: added serve RSS", f"{added_rss / 1024:.1f} MiB", "",
            f"median of {STARTS} starts with --probe-port, less {STARTS} without"),
        Row(f"probe thread wake-ups while idle ({IDLE_SECONDS:g} s)", f"{switches}", "0",
            "blocks in select without a timeout"),
    ]


if __name__ == "__main__":
    from bench.table import render

    print(render(run()))
