"""The loader process's memory beside the driver's, as the programming pod runs them.

On a fake node of four Intel ports: the real ``loader`` (``python -m plugin loader``, the
stand-in ``fpgaconf`` as its tool) and the real driver using it (``serve --api dra
--programming on --loader-socket``, an emulated 1.36 API server and kubelet:
:mod:`bench.dra_world`). The loader answers the driver's inventory and loads one image;
then both processes' VmRSS is read. Each figure is the median of :data:`RUNS` fresh pairs.
The loader's target is 20 MiB: it should hold no more than its job (no gRPC, HTTP or
Kubernetes client, none of the serving code; compat_tests/test_loader_edges.py checks the
modules themselves).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.dra_world import dra_world
from bench.table import Row, median
from compat_tests.fake_fpga_tools import write_stand_in_tools
from compat_tests.fake_sysfs import DEFAULT_INTERFACE_ID, build_ports
from compat_tests.fpga_images import NLB3_AFU_ID, build_gbs, write_image
from plugin.programming.ids import dashed

RUNS = 5
PORTS = 4
TARGET_MIB = 20.0


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def _ask(path: Path, body: dict[str, object]) -> dict[str, object]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(path))
        sock.sendall(json.dumps(body).encode() + b"\n")
        sock.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return json.loads(data)


async def _pair(root: Path) -> tuple[float, float]:
    """(loader, driver) VmRSS in MiB once the driver published every port and one image
    was loaded through the loader."""
    node = build_ports(root / "node", PORTS)
    library = root / "images"
    write_image(library, "nlb3.gbs", build_gbs(afu_ids=(NLB3_AFU_ID,),
                                               interface_id=dashed(DEFAULT_INTERFACE_ID)))
    tools = write_stand_in_tools(root / "tools", node)
    path = root / "run" / "loader.sock"
    loader = subprocess.Popen(
        [sys.executable, "-m", "plugin", "loader", "--backend", "intel", "--sysfs-root",
         str(node.sysfs_root), "--dev-root", str(node.dev_root), "--image-library",
         str(library), "--loader-socket", str(path), "--intel-loader", "fpgaconf",
         "--fpgaconf", str(tools.fpgaconf), "--loader-allowed-uids", str(os.geteuid())],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not path.exists():
            if time.monotonic() > deadline or loader.poll() is not None:
                raise RuntimeError("the loader did not start")
            await asyncio.sleep(0.05)
        flags = ("--programming", "on", "--intel-loader", "fpgaconf", "--fpgaconf",
                 str(root / "no-fpgaconf-here"), "--image-library", str(library),
                 "--loader-socket", str(path))
        async with dra_world(root / "world", node, PORTS, root / "serve.stderr",
                             serve=("-m", "plugin"), flags=flags) as world:
            inventory = await asyncio.to_thread(_ask, path, {"v": 1, "op": "inventory"})
            devices = inventory["devices"]
            assert isinstance(devices, dict)
            port = sorted(d for d, why in devices.items() if why is None)[0]
            loaded = await asyncio.to_thread(_ask, path, {
                "v": 1, "op": "load", "device": port, "function_id": NLB3_AFU_ID.replace("-", ""),
                "image": "nlb3.gbs", "sha256": None, "timeout": 30})
            if loaded.get("ok") is not True:
                raise RuntimeError(f"the bench load failed: {loaded}")
            return _rss_mib(loader.pid), _rss_mib(world.serve.pid)
    finally:
        loader.terminate()
        loader.wait(30)


def run() -> list[Row]:
    loaders, drivers = [], []
    for _ in range(RUNS):
        root = Path(tempfile.mkdtemp(prefix="ldb", dir="/tmp"))
        try:
            (root / "world").mkdir()
            loader, driver = asyncio.run(_pair(root))
        finally:
            shutil.rmtree(root, ignore_errors=True)
        loaders.append(loader)
        drivers.append(driver)
    spread = f"{min(loaders):.1f} to {max(loaders):.1f} MiB"
    met = "met" if median(loaders) <= TARGET_MIB else "NOT met"
    return [
        Row("resident memory of loader", f"{median(loaders):.1f} MiB",
            f"<= {TARGET_MIB:g} MiB", f"{met}; median of {RUNS} runs ({spread}), VmRSS after "
            f"an inventory and one load, {PORTS} fake Intel ports"),
        Row("resident memory of serve beside it", f"{median(drivers):.1f} MiB", "",
            f"median of {RUNS}: serve --api dra --programming on --loader-socket, same node, "
            "emulated 1.36 API server and kubelet"),
    ]


if __name__ == "__main__":
    from bench.table import render

    print(render(run()))
