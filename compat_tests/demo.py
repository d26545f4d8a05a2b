"""``make demo`` (``python -m compat_tests.demo``): a whole node, no hardware, no cluster.

A fake sysfs tree with Intel FPGA cards (both drivers, SR-IOV, two NUMA nodes; with
``--node mixed`` also AWS FPGA slots and Alveo cards, served together by ``--backend auto``),
the real serving daemon, and emulated kubelets: a Kubernetes 1.9 kubelet that the plugin must reach
through v1alpha2, an upgrade of the node to 1.26 (v1beta1) under the running plugin, a port
whose firmware crashes and recovers, a port that is unplugged, and a clean stop.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from pathlib import Path

from api_versions.retry import RetryPolicy
from compat_tests.fake_alveo import build_mixed_node
from compat_tests.fake_sysfs import CRASHED_AFU_ID, DEFAULT_AFU_ID, build_intel_node
from compat_tests.kubelet import KubeletEmulator, PluginCallError
from plugin.cli.config import Settings
from plugin.discovery.backends import make_backend
from plugin.process.daemon import Daemon
from plugin.process.logs import configure
from plugin.serving.deviceplugin.timing import Timing

RESOURCE = "b-com.com/accelerator"
SHOWN_LOGGERS = ("api_versions.negotiate", "plugin.serving.deviceplugin",
                 "plugin.discovery.monitor", "plugin.process.daemon", "plugin.process.dra_side",
                 "plugin.serving.dra.publisher")


def say(text: str = "") -> None:
    print(text, flush=True)


def section(title: str) -> None:
    say()
    say(f"== {title} ==")


class _Narrator(logging.Handler):
    """Shows the plugin's own log lines, indented, so negotiation can be watched as it happens."""

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith(SHOWN_LOGGERS) and record.levelno >= logging.INFO:
            say(f"   plugin | {record.getMessage()}")
        elif record.name.startswith("compat_tests") and record.levelno >= logging.INFO:
            say(f"  kubelet | {record.getMessage()}")


@contextlib.contextmanager
def _narration() -> Iterator[None]:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    root.handlers[:] = [_Narrator()]
    root.setLevel(logging.INFO)
    try:
        yield
    finally:
        root.handlers[:], root.level = saved


def _show_devices(kubelet: KubeletEmulator) -> None:
    for device in kubelet.devices(RESOURCE).values():
        numa = ",".join(map(str, device.numa_nodes)) or "-"
        say(f"           {device.id:<22} {device.health:<10} NUMA {numa}")


async def _until(condition: Callable[[], bool], timeout: float = 10.0) -> float:
    began = time.perf_counter()
    while not condition():
        if time.perf_counter() - began > timeout:
            raise TimeoutError("the simulated node did not reach the expected state")
        await asyncio.sleep(0.01)
    return time.perf_counter() - began


async def run_demo(kind: str = "intel") -> int:
    return await told_in("dpdemo", lambda root: _story(root, kind))


async def told_in(prefix: str, story: Callable[[Path], Awaitable[None]]) -> int:
    """Run a demo's ``story`` in a fresh directory under /tmp, narrated, removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        with _narration():
            await story(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def show_container(cdi: Path, ids: Sequence[str]) -> None:
    """What the container of CDI devices ``ids`` gets from the specs in ``cdi``."""
    for spec_file in sorted(cdi.glob("*.json")):
        spec = json.loads(spec_file.read_text())
        for entry in spec["devices"]:
            if f"{spec['kind']}={entry['name']}" in ids:
                edits = entry["containerEdits"]
                for env in edits.get("env", []):
                    say(f"  the container gets {env}")
                for dev in edits.get("deviceNodes", []):
                    say(f"  the container gets device node {dev['path']}")


async def _story(root: Path, kind: str) -> None:
    mixed = kind == "mixed"
    node = build_mixed_node(root / "node") if mixed else build_intel_node(root / "node")
    backend_name = "auto" if mixed else "intel"
    directory = root / "device-plugins"
    settings = Settings(
        device_plugin_dir=directory, backend=backend_name, sysfs_root=node.sysfs_root,
        dev_root=node.dev_root, kubelet_check_interval=1.0,
        retry=RetryPolicy(attempts=3, max_backoff=0.2, register_timeout=5.0),
    )
    backend = make_backend(backend_name, node.config())

    if mixed:
        section("A simulated node: Intel, AWS and Alveo FPGAs under a fake /sys and /dev")
    else:
        section("A simulated node: Intel FPGA cards under a fake /sys and /dev")
    say(f"  sysfs root {node.sysfs_root}")
    for device in sorted(backend.scan(), key=lambda d: d.id):
        what = device.attribute("port") or device.attribute("shell") or \
            f"slot {device.attribute('slot')}"
        say(f"  {device.backend:<6} {device.attribute('driver'):<10} {what:<34} "
            f"function {device.attribute('pci_address') or device.id}")

    section("Kubernetes 1.9 kubelet starts; the plugin starts and negotiates")
    kubelet = KubeletEmulator(directory, "1.9")
    await kubelet.start()
    daemon = Daemon(settings, backend, timing=Timing(round_backoff_initial=0.2))
    serving = asyncio.create_task(daemon.run())
    await kubelet.wait_for_devices(RESOURCE, timeout=15)
    say(f"  the kubelet ({kubelet.generation}) sees:")
    _show_devices(kubelet)

    section("A pod asks for two accelerators")
    chosen = sorted(kubelet.devices(RESOURCE))[:2]
    granted = await kubelet.allocate(RESOURCE, chosen)
    say(f"  ACCELERATOR_UNITS={granted.envs['ACCELERATOR_UNITS']}")
    for spec in granted.devices:
        say(f"  device node {spec.host_path} -> {spec.container_path} ({spec.permissions})")
    say("  a pod asks for a device this node does not have:")
    try:
        await kubelet.allocate(RESOURCE, ["0000:99:00.0"])
    except PluginCallError as refusal:
        say(f"  refused: {refusal}")

    section("The node is upgraded to Kubernetes 1.26; the plugin keeps running")
    await kubelet.stop()
    kubelet = KubeletEmulator(directory, "1.26")
    began = time.perf_counter()
    await kubelet.start()
    await kubelet.wait_for_devices(RESOURCE, timeout=15)
    say(f"  registered again through {kubelet.generation} "
        f"{(time.perf_counter() - began) * 1000:.0f} ms after the new kubelet started")
    _show_devices(kubelet)
    available = list(kubelet.devices(RESOURCE))
    preferred = await kubelet.preferred_allocation(RESOURCE, available, [], 2)
    say(f"  preferred allocation for 2 devices (one NUMA node): {', '.join(preferred)}")
    granted = await kubelet.allocate(RESOURCE, preferred)
    say(f"  ACCELERATOR_UNITS={granted.envs['ACCELERATOR_UNITS']}")

    section("A port's firmware crashes (AFU ID reads all f), then is reloaded")
    port_name, port = next(iter(sorted(node.ports.items())))
    victim = _device_of(kubelet, port.bdf)
    node.set_afu_id(port_name, CRASHED_AFU_ID)
    took = await _until(lambda: not kubelet.devices(RESOURCE)[victim].healthy)
    say(f"  the kubelet sees {victim} Unhealthy after {took * 1000:.0f} ms")
    node.set_afu_id(port_name, DEFAULT_AFU_ID)
    took = await _until(lambda: kubelet.devices(RESOURCE)[victim].healthy)
    say(f"  and Healthy again after {took * 1000:.0f} ms")

    section("A port is unplugged")
    port_name, port = sorted(node.ports.items())[-1]
    gone = _device_of(kubelet, port.bdf)
    node.remove_port(port_name)
    took = await _until(lambda: gone not in kubelet.devices(RESOURCE))
    say(f"  {gone} left the kubelet's list after {took * 1000:.0f} ms")

    section("The plugin is stopped (as on SIGTERM when its pod is deleted)")
    daemon.stop()
    code = await serving
    await kubelet.stop()
    leftover = sorted(p.name for p in directory.iterdir())
    say(f"  exit code {code}; files left in the device-plugin directory: {leftover or 'none'}")
    say()


def _device_of(kubelet: KubeletEmulator, bdf: str) -> str:
    """The kubelet-visible ID of the port on function ``bdf`` (the BDF, or BDF-portN)."""
    for device_id in sorted(kubelet.devices(RESOURCE)):
        if device_id == bdf or device_id.startswith(f"{bdf}-"):
            return device_id
    raise LookupError(f"no device for function {bdf}")


NODES = ("intel", "mixed", "migrate", "program", "share")


def main(argv: Sequence[str] | None = None) -> int:
    """``make demo [DEMO=<node>]``: the demo runs from the checkout's root, never from an
    install, so its entry lives here with its code rather than in the installed CLI."""
    parser = argparse.ArgumentParser(
        prog="python -m compat_tests.demo",
        description="simulated node: emulated kubelet + built-in devices")
    parser.add_argument("--node", choices=NODES, default="intel",
                        help="intel: Intel cards, served by the intel backend; mixed: Intel, "
                             "AWS and Alveo cards together, served by the auto backend; "
                             "migrate: one node moved to DRA and back; program: the function "
                             "a pod needs, loaded on demand; share: three pods on one port "
                             "holding one function")
    node = parser.parse_args(argv).node
    # As the daemon's own CLI sets them: gRPC's core logs in its own format, and the
    # plugin's logs go through the same configuration a node install uses.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    configure("info", "text")
    try:
        return asyncio.run(_story_of(node))
    except KeyboardInterrupt:
        return 130


def _story_of(node: str) -> Coroutine[object, object, int]:
    if node == "migrate":
        from compat_tests.demo_migrate import run_migration_demo

        return run_migration_demo()
    if node == "program":
        from compat_tests.demo_program import run_programming_demo

        return run_programming_demo()
    if node == "share":
        from compat_tests.demo_share import run_sharing_demo

        return run_sharing_demo()
    return run_demo(node)


if __name__ == "__main__":
    sys.exit(main())
