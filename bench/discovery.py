"""Discovery cost: one full scan of fake nodes of growing size, and of this host's real /sys.

A scan runs on every hot-plug event and every rescan interval for the life of the node, so
its cost is what an idle plugin spends. Trees are built on a memory file system when there
is one, as sysfs itself lives in memory.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.table import Row, median, ms
from compat_tests.fake_alveo import build_alveo_node
from compat_tests.fake_sysfs import (
    FakeNode,
    build_f1_16xlarge,
    build_f2_48xlarge,
    build_ports,
)
from plugin.discovery.backends import BackendConfig, make_backend
from plugin.discovery.backends.aws import AwsBackend
from plugin.discovery.backends.base import Backend
from plugin.model.resources import group_by_resource
from value_types.devices import DeviceSet

FAST_TMP = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
TARGET = "< 100 ms"
"""A tenth of the 1 s budget from hot-plug to ListAndWatch."""


def _median_scan(backend: Backend, runs: int, expected: int) -> float:
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        devices = backend.scan()
        times.append(time.perf_counter() - began)
        if len(devices) != expected:
            raise RuntimeError(f"{backend.name}: found {len(devices)} devices, expected {expected}")
    return median(times)


def _on_tree(build: Callable[[Path], FakeNode], measure: Callable[[FakeNode], Row]) -> Row:
    root = Path(tempfile.mkdtemp(prefix="dpdisc", dir=FAST_TMP))
    try:
        return measure(build(root))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _ports_row(count: int, driver: str, runs: int) -> Row:
    def measure(node: FakeNode) -> Row:
        seconds = _median_scan(make_backend("intel", node.config()), runs, count)
        return Row(f"discovery, {count} {driver} port{'s' if count > 1 else ''}", ms(seconds),
                   TARGET, f"median of {runs} full scans")

    return _on_tree(lambda root: build_ports(root, count, driver), measure)


def _aws_row(label: str, build: Callable[[Path], FakeNode], runs: int) -> Row:
    """An 8-slot AWS instance; F2 reads a little more per slot (BAR0, subsystem IDs)."""
    def measure(node: FakeNode) -> Row:
        seconds = _median_scan(make_backend("aws", node.config()), runs, 8)
        return Row(f"discovery, {label} (8 slots)", ms(seconds), TARGET,
                   f"median of {runs} full scans")

    return _on_tree(build, measure)


def _host_row(runs: int) -> Row:
    backend = make_backend("auto", BackendConfig())
    found = len(backend.scan())
    seconds = _median_scan(backend, runs, found)
    functions = len(os.listdir(AwsBackend(BackendConfig()).devices_dir))
    return Row("discovery, auto on this host's /sys", ms(seconds), TARGET,
               f"median of {runs}; {found} accelerators, {functions} PCI functions")


def _grouping_row(runs: int) -> Row:
    def measure(node: FakeNode) -> Row:
        devices = DeviceSet.of(make_backend("intel", node.config()).scan())
        times = []
        for _ in range(runs):
            began = time.perf_counter()
            group_by_resource(devices, "afu", "b-com.com/accelerator", "b-com.com")
            times.append(time.perf_counter() - began)
        return Row("afu-mode grouping, 256 ports", ms(median(times)), "< 5 ms",
                   f"median of {runs}")

    return _on_tree(lambda root: build_ports(root, 256), measure)


def _alveo_row(runs: int) -> Row:
    def measure(node: FakeNode) -> Row:
        seconds = _median_scan(make_backend("alveo", node.config()), runs, 8)
        return Row("discovery, 8 Alveo cards", ms(seconds), TARGET,
                   f"median of {runs} full scans; render nodes, shells and health files")

    return _on_tree(build_alveo_node, measure)


def run() -> list[Row]:
    return [
        _ports_row(1, "dfl", 200),
        _ports_row(8, "dfl", 100),
        _ports_row(256, "dfl", 20),
        _ports_row(256, "intel-fpga", 20),
        _aws_row("f1.16xlarge", build_f1_16xlarge, 100),
        _aws_row("f2.48xlarge", build_f2_48xlarge, 100),
        _host_row(50),
        _grouping_row(100),
        _alveo_row(100),
    ]


if __name__ == "__main__":
    from bench.table import render

    print(render(run()))
