"""The serving daemon in-process against emulated kubelets: resources, liveness, the demo."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from api_versions.retry import RetryPolicy
from compat_tests.fake_sysfs import (
    DEFAULT_AFU_ID,
    OTHER_AFU_ID,
    FakeNode,
    build_intel_node,
)
from compat_tests.kubelet import KubeletEmulator
from plugin.cli.config import Settings
from plugin.discovery.backends import make_backend
from plugin.model.resources import afu_resource_name
from plugin.process.daemon import Daemon, heartbeat_fresh
from plugin.serving.deviceplugin.timing import Timing

FAST_TIMING = Timing(round_backoff_initial=0.1, round_backoff_max=0.5)


@pytest.fixture
def root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dpd", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def settings_for(root: Path, node: FakeNode, **changes: object) -> Settings:
    base = Settings(
        device_plugin_dir=root / "dp", backend="intel", sysfs_root=node.sysfs_root,
        dev_root=node.dev_root, rescan_interval=0.2, kubelet_check_interval=0.5,
        retry=RetryPolicy(attempts=3, max_backoff=0.1, register_timeout=5.0),
    )
    return replace(base, **changes)


@pytest.fixture
async def running(root: Path) -> AsyncIterator[tuple[FakeNode, KubeletEmulator, list]]:
    """A fake Intel node, a 1.26 kubelet, and a way to start daemons stopped at teardown."""
    node = build_intel_node(root / "node")
    kubelet = KubeletEmulator(root / "dp", "1.26")
    await kubelet.start()
    started: list[tuple[Daemon, asyncio.Task[int]]] = []
    yield node, kubelet, started
    for daemon, task in started:
        daemon.stop()
        assert await asyncio.wait_for(task, 10) == 0
    await kubelet.stop()


def start(started: list, settings: Settings, node: FakeNode) -> Daemon:
    daemon = Daemon(settings, make_backend(settings.backend, node.config()), timing=FAST_TIMING)
    started.append((daemon, asyncio.create_task(daemon.run())))
    return daemon


async def test_afu_mode_gives_each_afu_its_own_registered_resource(root, running) -> None:
    node, kubelet, started = running
    start(started, settings_for(root, node, resource_mode="afu"), node)
    default = afu_resource_name("b-com.com", DEFAULT_AFU_ID)
    other = afu_resource_name("b-com.com", OTHER_AFU_ID)
    await kubelet.wait_for_devices(default, timeout=10)
    await kubelet.wait_for_devices(other, timeout=10)
    assert set(kubelet.devices(other)) == {"0000:d8:00.0"}
    assert len(kubelet.devices(default)) == 5
    sockets = {r.endpoint for r in kubelet.registrations}
    assert len(sockets) == 2, "each resource registers on a socket of its own"

    # Reprogramming the only port of the other AFU moves it; that resource is withdrawn.
    [port] = [n for n, p in node.ports.items() if p.bdf == "0000:d8:00.0"]
    node.set_afu_id(port, DEFAULT_AFU_ID)
    await kubelet.wait_for_devices(default, lambda d: len(d) == 6, timeout=10)
    withdrawn = kubelet.endpoint_socket(other)
    deadline = time.monotonic() + 10
    while withdrawn is not None and withdrawn.exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert withdrawn is None or not withdrawn.exists()


async def test_zero_devices_still_registers_and_devices_appear_later(root, running) -> None:
    _node, kubelet, started = running
    empty = FakeNode(root / "empty")
    daemon = start(started, settings_for(root, empty), empty)
    await kubelet.wait_for_registrations(1, timeout=10)
    assert kubelet.devices("b-com.com/accelerator") == {}
    empty.add_dfl_card("0000:3b:00.0", numa_node=1)
    devices = await kubelet.wait_for_devices("b-com.com/accelerator", timeout=10)
    assert list(devices) == ["0000:3b:00.0"]
    assert devices["0000:3b:00.0"].numa_nodes == (1,)
    assert daemon.resources["b-com.com/accelerator"].server.registrations == 1


async def test_heartbeat_is_written_after_self_checks(root, running) -> None:
    node, kubelet, started = running
    heartbeat = root / "run" / "heartbeat"
    start(started, settings_for(root, node, heartbeat_file=heartbeat, heartbeat_interval=0.1),
          node)
    await kubelet.wait_for_registrations(1, timeout=10)
    deadline = time.monotonic() + 10
    while not heartbeat.exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert heartbeat_fresh(heartbeat, 30)[0]
    old = time.time() - 120
    os.utime(heartbeat, (old, old))
    fresh, reason = heartbeat_fresh(heartbeat, 60)
    assert not fresh and "old" in reason


def test_healthcheck_command_reports_fresh_stale_and_missing(root: Path) -> None:
    heartbeat = root / "heartbeat"

    def check() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "plugin", "healthcheck", "--heartbeat-file", str(heartbeat),
             "--heartbeat-max-age", "30"], capture_output=True, text=True, timeout=60,
        )

    assert check().returncode == 1
    heartbeat.write_text("x")
    assert check().returncode == 0
    os.utime(heartbeat, (time.time() - 60, time.time() - 60))
    stale = check()
    assert stale.returncode == 1 and "old" in stale.stdout


@pytest.mark.parametrize("kind", ["intel", "mixed"])
def test_demo_runs_the_whole_story(kind: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "compat_tests.demo", "--node", kind], capture_output=True,
        text=True, timeout=120, cwd=Path(__file__).resolve().parent.parent,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    if kind == "mixed":
        assert "auto backend found 6 devices" in out
        assert all(f in out for f in ("aws-f1", "xocl", "dfl", "intel-fpga"))
    assert "registered b-com.com/accelerator through API generation v1alpha2" in out
    assert "registered again through v1beta1" in out
    assert "refused:" in out and "INVALID_ARGUMENT" in out
    assert "Unhealthy after" in out and "Healthy again after" in out
    assert "exit code 0; files left in the device-plugin directory: none" in out


def test_programming_demo_loads_the_function_a_pod_asks_for() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "compat_tests.demo", "--node", "program"], capture_output=True,
        text=True, timeout=120, cwd=Path(__file__).resolve().parent.parent,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "programmable True" in out and "config from FromClass" in out
    assert "request 0xb680 (DFL_FPGA_FME_PORT_PR), argsz 24, port_id 0, 8192 bytes: the " \
        "GBS's bitstream exactly" in out
    assert "republished with afuID d8424dc4a4a3c413f89e433683f9040b" in out
    assert "the container gets ACCELERATOR_UNITS=" in out
    assert "FunctionLoaded=True (Loaded)" in out
    assert "Normal  FunctionLoaded  Device 0000:3b:00.0: afuID d8424dc4" in out
    assert "loads this time: 0 (the port holds nlb0: the fast path)" in out
    assert "was loaded already" in out and "exit code 0" in out
    # A shared cluster's guards: a tenant's own function, and a pinned image replaced.
    assert "DeviceClass 'nlb0.accelerator.b-com.com' does not let claims choose afuID " \
        "f7df405c" in out
    assert "Warning  FunctionNotAllowed  not_allowed: afuID f7df405c" in out
    assert "its configuration pins; nothing was loaded" in out
    assert "Warning  ImageDigestMismatch  digest_mismatch" in out
    assert out.count("loads this time: 0; the port is untouched and healthy") == 2
    # --program-at bind: the first card's load fails, the pod moves to the second card.
    scene = out[out.index("Loading before the pod binds (--program-at bind)"):]
    assert scene.count("bindingConditions ['accelerator.b-com.com/FunctionReady'], "
                       "bindingFailureConditions ['accelerator.b-com.com/FunctionFailed']") == 2
    events = re.findall(r"^    (?:Normal|Warning) +(\w+) +(\w+) ", scene, re.MULTILINE)
    assert [r for r, kind in events if kind == "Pod"] == [
        "BindingConditionsPending", "FailedScheduling", "BindingConditionsPending"]
    assert sorted(r for r, kind in events if kind == "ResourceClaim") == [
        "FunctionLoadFailed", "FunctionLoaded"]
    assert "FunctionFailed on pci-0000-3b-00-0, as PreBind read it: claim moved binding " \
        "failed: reason=FunctionNotGiven" in scene and "port-PR ioctl: Input/output" in scene
    assert "allocations tried: pci-0000-3b-00-0 then pci-0000-d8-00-0; bound: True" in scene
    assert "pci-0000-3b-00-0 tainted: accelerator.b-com.com/unhealthy=load-failed:NoSchedule" \
        in scene
    assert "claim status, pci-0000-d8-00-0: accelerator.b-com.com/FunctionReady=True " \
        "(Loaded)" in scene
    assert "(loads at prepare: 0; before binding: 1 failed, 1 good)" in scene
    assert "the container gets ACCELERATOR_DEVICES=0000:d8:00.0" in scene
    assert "the plugin stopped, exit code 0" in scene


def test_sharing_demo_puts_three_pods_on_one_port_and_refuses_a_fourth_and_a_reload() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "compat_tests.demo", "--node", "share"], capture_output=True,
        text=True, timeout=120, cwd=Path(__file__).resolve().parent.parent,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "published whole (no allowMultipleAllocations): NLB3 was not loaded" in out
    assert out.count("allowMultipleAllocations: true, capacity contexts: 4 (requestPolicy "
                     "default 1, validRange 1..4 step 1)") == 2
    shares = re.findall(r"claim (worker-\d): pci-0000-3b-00-0 shareID ([0-9a-f-]{36}) "
                        r"consumedCapacity contexts (\d)", out)
    assert [(name, n) for name, _, n in shares] == [
        ("worker-0", "1"), ("worker-1", "1"), ("worker-2", "2")]
    for name, share, contexts in shares:
        assert (f"{name}'s container (share_id {share} in the kubelet's answer): "
                f"ACCELERATOR_DEVICES=0000:3b:00.0 ACCELERATOR_SHARE_ID={share} "
                f"ACCELERATOR_SHARE_CONTEXTS={contexts}") in out
        assert f"{name}: device pci-0000-3b-00-0 shareID {share} Ready=True (Prepared)" in out
    assert "claim default/worker-3 request 'fpga': 0 of 1 devices of class " \
        "'nlb0-shared.accelerator.b-com.com' are free" in out
    assert "the device holds afuID d8424dc4-a4a3-c413-f89e-433683f9040b and the claim's " \
        "function is afuID f7df405c-bd7a-cf72-22f1-44b0b93acd18" in out
    assert "loads this time: 0; the port still holds afuID d8424dc4" in out
    assert "NodeUnprepareResources for worker-2 (the port's last share): done" in out
    assert "CDI specs of claims left: none; loads so far: 1" in out and "exit code 0" in out


def test_migration_demo_moves_one_node_to_dra_and_back() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "compat_tests.demo", "--node", "migrate"], capture_output=True,
        text=True, timeout=120, cwd=Path(__file__).resolve().parent.parent,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    said = [line for line in out.splitlines() if "serving its devices through" in line]
    assert ["through DRA" in line for line in said] == [False, True, False], said
    assert out.count("Allocate through v1beta1: ACCELERATOR_UNITS=") == 2
    assert "the kubelet holds no device-plugin registration: True" in out
    assert "NodePrepareResources -> CDI devices" in out
    assert "the container gets ACCELERATOR_UNITS=" in out
    assert "the slices are withdrawn" in out and "exit code 0" in out
    assert out.count("Normal  ServingAPIChanged  Devices are served through") == 2
    # A device still in use through the old API stays out of the new one until released.
    assert "still used by default/legacy-pod through the device plugin: taint " \
        "accelerator.b-com.com/in-use=device-plugin:NoSchedule" in out
    assert "legacy-pod ends: pci-0000-3b-00-0 is offered through DRA" in out
    assert "still prepared for claim default/pod-accelerators: Unhealthy to the kubelet" in out
    assert "its claim is released: 0000:3b:00.0-port1 Healthy" in out
    assert out.count("Warning  DevicesHeldAcrossMove") == 2


async def test_failures_without_kernel_events_are_seen_through_health_files(root, running) -> None:
    """A crashed AFU or a latched port error gives no event; with full rescans 60 s apart,
    only the health-file re-reads can report them within the wait below."""
    node, kubelet, started = running
    start(started, settings_for(root, node, rescan_interval=60.0, health_interval=0.1), node)
    resource = "b-com.com/accelerator"
    await kubelet.wait_for_devices(resource, timeout=10)
    crashed, errored = sorted(node.ports)[:2]
    crashed_id, errored_id = (_id_of(kubelet, node.ports[p].bdf, resource)
                              for p in (crashed, errored))

    node.set_afu_id(crashed, "f" * 32)
    node.set_port_error(errored, 0x10)
    await kubelet.wait_for_devices(
        resource, lambda d: not d[crashed_id].healthy and not d[errored_id].healthy, timeout=10)

    node.set_afu_id(crashed, DEFAULT_AFU_ID)
    node.set_port_error(errored, 0)
    await kubelet.wait_for_devices(resource, timeout=10)  # default: all healthy again


def _id_of(kubelet: KubeletEmulator, bdf: str, resource: str) -> str:
    return next(i for i in sorted(kubelet.devices(resource)) if i.split("-")[0] == bdf)


async def test_a_socket_that_cannot_be_served_is_retried_not_fatal(root: Path) -> None:
    """The device-plugin directory is not creatable (a file is in the way): the server logs,
    keeps the process alive and serves once the obstacle is gone."""
    from api_versions.negotiate import adapters
    from plugin.model.feed import DeviceFeed
    from plugin.serving.deviceplugin.server import ResourceServer
    from value_types.devices import DeviceSet

    blocked = root / "dp"
    blocked.write_text("not a directory")
    server = ResourceServer(
        "b-com.com/accelerator", blocked, "a.sock", DeviceFeed(DeviceSet.of(())),
        adapters(), RetryPolicy(attempts=1), Timing(round_backoff_max=1.0),
    )
    task = asyncio.create_task(server.run())
    await asyncio.sleep(0.3)
    assert not task.done() and not server.serving
    blocked.unlink()
    deadline = time.monotonic() + 10
    while not (blocked / "a.sock").exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert (blocked / "a.sock").exists()
    server.stop()
    await asyncio.wait_for(task, 10)
    assert not (blocked / "a.sock").exists()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGQUIT])
def test_signal_stops_serve_cleanly(root: Path, signum: int) -> None:
    directory = root / "dp"
    process = subprocess.Popen(
        [sys.executable, "-m", "plugin", "serve", "--backend", "units",
         "--device-plugin-dir", str(directory), "--log-format", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not (directory / "accelerator.sock").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (directory / "accelerator.sock").exists()
        process.send_signal(signum)
        _out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0
    assert not (directory / "accelerator.sock").exists()
    lines = [json.loads(line) for line in err.splitlines()]
    assert [e["message"] for e in lines[-2:]] == ["stopping", "stopped; sockets removed"]


async def test_garbage_on_the_wire_is_answered_and_the_daemon_keeps_serving(root, running) -> None:
    import grpc

    node, kubelet, started = running
    start(started, settings_for(root, node), node)
    resource = "b-com.com/accelerator"
    await kubelet.wait_for_devices(resource, timeout=10)
    socket = kubelet.endpoint_socket(resource)
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        allocate = channel.unary_unary("/v1beta1.DevicePlugin/Allocate")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await allocate(b"\xff\xff\xff\xff garbage", timeout=5)
        assert refused.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)
        unknown = channel.unary_unary("/v1beta1.DevicePlugin/Nonsense")
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await unknown(b"", timeout=5)
        assert missing.value.code() == grpc.StatusCode.UNIMPLEMENTED
    granted = await kubelet.allocate(resource, ["0000:5e:00.0"])
    assert granted.envs["ACCELERATOR_UNITS"] == "0000:5e:00.0"
