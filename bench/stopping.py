"""SIGTERM to exit, as the kubelet's pod stop feels it, with and without a sysfs read hanging.

The real ``serve`` process runs the Intel backend on a fake node (two ports) registered with
an emulated 1.26 kubelet. Each figure is the time from SIGTERM to the process having exited
(exit status 0 checked). With a read hanging (an ``afu_id`` read that never returns, put in
front of the process as ``compat_tests/test_faults_discovery.py`` does, until the devices
are reported Unhealthy): the worker thread stuck in it must not be waited for. The tests
assert that it exits; how fast is here.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from bench.serving import serve_command
from bench.table import Row, median, ms
from compat_tests.fake_sysfs import FakeNode
from compat_tests.kubelet import KubeletEmulator
from compat_tests.test_faults_discovery import HANGING_READS

RESOURCE = "b-com.com/accelerator"
ROUNDS = 5
PATIENCE = 30.0


def _spawn(root: Path, node: FakeNode, marker: Path) -> subprocess.Popen[bytes]:
    inject = root / "inject"
    inject.mkdir(exist_ok=True)
    (inject / "sitecustomize.py").write_text(HANGING_READS)
    env = dict(os.environ, DP_TEST_HANG_MARKER=str(marker), PYTHONPATH=os.pathsep.join(
        [str(inject), *filter(None, [os.environ.get("PYTHONPATH")])]))
    command = serve_command(root / "dp", "--backend", "intel", "--sysfs-root",
                            str(node.sysfs_root), "--dev-root", str(node.dev_root),
                            "--health-interval", "0.2", "--scan-stall-timeout", "1")
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


async def _stop_once(root: Path, hang: bool) -> float:
    node = FakeNode(root / "node")
    node.add_opae_card("0000:5e:00.0", numa_node=0)
    node.add_dfl_card("0000:d8:00.0", numa_node=1)
    (root / "dp").mkdir()
    marker = root / "hang"
    async with KubeletEmulator(root / "dp", "1.26") as kubelet:
        process = _spawn(root, node, marker)
        try:
            await kubelet.wait_for_devices(
                RESOURCE, lambda d: len(d) == 2 and all(x.healthy for x in d.values()),
                timeout=PATIENCE)
            if hang:
                marker.touch()
                await kubelet.wait_for_devices(
                    RESOURCE, lambda d: not any(x.healthy for x in d.values()),
                    timeout=PATIENCE)
            began = time.perf_counter()
            process.send_signal(signal.SIGTERM)
            status = await asyncio.to_thread(process.wait, PATIENCE)
            took = time.perf_counter() - began
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    if status != 0:
        raise RuntimeError(f"serve exited with {status} on SIGTERM")
    return took


def _rounds(hang: bool) -> list[float]:
    figures = []
    for _ in range(ROUNDS):
        root = Path(tempfile.mkdtemp(prefix="dpstop", dir="/tmp"))
        try:
            figures.append(asyncio.run(_stop_once(root, hang)))
        finally:
            shutil.rmtree(root, ignore_errors=True)
    return figures


def run() -> list[Row]:
    idle, hung = _rounds(False), _rounds(True)
    return [
        Row("SIGTERM -> exited", ms(median(idle)), "< 1 s",
            f"median of {ROUNDS}, max {ms(max(idle))}; Intel backend, two ports, registered"),
        Row("SIGTERM -> exited, a sysfs read hanging", ms(median(hung)), "< 2 s",
            f"median of {ROUNDS}, max {ms(max(hung))}; the stuck worker is not waited for"),
    ]


if __name__ == "__main__":
    from bench.table import render

    print(render(run()))
