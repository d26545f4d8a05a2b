"""The loader process's memory beside the driver's, as the programming pod runs them.

On a fake node of four Intel ports: the real ``loader`` (``python -m plugin loader``, the
stand-in ``fpgaconf`` as its tool, ``--require-image-digest`` as the chart's programming
example runs it) and the real driver using it (``serve --api dra
--programming on --loader-socket``, an emulated 1.36 API server and kubelet:
:mod:`bench.dra_world`). The loader answers the driver's inventory and loads one image;
then both processes' VmRSS is read. Each figure is the median of :data:`RUNS` fresh pairs.
The loader's target is 20 MiB: it should hold no more than its job (no gRPC, HTTP or
Kubernetes client, none of the serving code, no OpenSSL; compat_tests/test_loader_edges.py
checks the modules themselves).

What holding no OpenSSL costs is measured beside it: the rate at which the interpreter's own
SHA-256 (:mod:`plugin.model.sha256`, what a load hashes its image with) and
OpenSSL's (:mod:`hashlib`) hash a 64 MiB image in 1 MiB chunks, as a load reads it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.dra_world import dra_world
from bench.table import Row, median
from compat_tests.fake_fpga_tools import write_stand_in_tools
from compat_tests.fake_sysfs import DEFAULT_INTERFACE_ID, build_ports
from compat_tests.fpga_images import NLB3_AFU_ID, build_gbs, write_image
from plugin.model.sha256 import new_sha256
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
         "--fpgaconf", str(tools.fpgaconf), "--loader-allowed-uids", str(os.geteuid()),
         "--require-image-digest"],
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
            pinned = hashlib.sha256((library / "nlb3.gbs").read_bytes()).hexdigest()
            loaded = await asyncio.to_thread(_ask, path, {
                "v": 1, "op": "load", "device": port, "function_id": NLB3_AFU_ID.replace("-", ""),
                "image": "nlb3.gbs", "sha256": pinned, "timeout": 30})
            if loaded.get("ok") is not True:
                raise RuntimeError(f"the bench load failed: {loaded}")
            return _rss_mib(loader.pid), _rss_mib(world.serve.pid)
    finally:
        loader.terminate()
        loader.wait(30)


HASHED_MIB = 64


def _hash_rate(new: Callable[[], object]) -> float:
    """MB/s hashing :data:`HASHED_MIB` MiB of random bytes in 1 MiB chunks (median of 3)."""
    data = os.urandom(HASHED_MIB << 20)
    rates = []
    for _ in range(3):
        started = time.perf_counter()
        hasher = new()
        view = memoryview(data)
        for offset in range(0, len(data), 1 << 20):
            hasher.update(view[offset:offset + (1 << 20)])  # type: ignore[attr-defined]
        hasher.hexdigest()  # type: ignore[attr-defined]
        rates.append(len(data) / 1e6 / (time.perf_counter() - started))
    return median(rates)


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
            f"an inventory and one pinned load, {PORTS} fake Intel ports"),
        Row("resident memory of serve beside it", f"{median(drivers):.1f} MiB", "",
            f"median of {RUNS}: serve --api dra --programming on --loader-socket, same node, "
            "emulated 1.36 API server and kubelet"),
        *_hashing_rows(),
    ]


def _hashing_rows() -> list[Row]:
    builtin, openssl = _hash_rate(new_sha256), _hash_rate(hashlib.sha256)
    extra = 400 * (1 << 20) / 1e6 * (1 / builtin - 1 / openssl)
    return [
        Row("sha256 rate, interpreter's own (loader)", f"{builtin:.0f} MB/s", "",
            f"median of 3 over {HASHED_MIB} MiB in 1 MiB chunks; {openssl / builtin:.1f}x "
            f"slower than OpenSSL: +{extra:.2f} s on a 400 MiB bitstream"),
        Row("sha256 rate, OpenSSL (reference)", f"{openssl:.0f} MB/s", "",
            "hashlib.sha256, same data, same run"),
    ]


if __name__ == "__main__":
    from bench.table import render

    print(render(run()))
