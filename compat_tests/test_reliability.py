"""The reliability suite: faults a production node throws at the plugin, replayed against the
real ``serve`` process over real unix sockets.

Every case is something that happens on real nodes: kubelets killed at odd moments and
restarted with or without wiping the directory, a second plugin instance during a rolling
update, unwritable directories, signal storms, long runs of Allocate. What is asserted is
what happens (a kubelet met, one handover, no growth in descriptors or threads); how soon is
measured in ``bench/`` (core, failover, registration) and docs/performance.md, never here:
a wall-clock bound fails on a busy machine without a fault.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import tempfile
from pathlib import Path

import grpc
import pytest

from api_versions.wire import WireApi, client_call
from compat_tests.fake_sysfs import (
    FakeNode,
)
from compat_tests.kubelet import PluginCallError
from compat_tests.plugin_process import PluginProcess
from compat_tests.test_matrix import ALL_UNITS, RESOURCE, SETTLE, assert_serves_units, unit_ids

NO_SAFETY_NET = ("--kubelet-check-interval", "3600")
"""The periodic check for a restarted kubelet, out of a test's life: a kubelet met then was
met by the event that says it came, not by the check."""


def resources_of(process: PluginProcess) -> tuple[int, int]:
    """Open descriptors and threads of the plugin process."""
    fds = len(os.listdir(f"/proc/{process.pid}/fd"))
    with open(f"/proc/{process.pid}/status") as status:
        threads = next(int(line.split()[1]) for line in status if line.startswith("Threads:"))
    return fds, threads


def rss_kib(process: PluginProcess) -> int:
    with open(f"/proc/{process.pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def messages(process: PluginProcess) -> list[str]:
    return [e.get("message", e.get("raw", "")) for e in process.entries()]


async def until_served(kubelet, units=ALL_UNITS, timeout=SETTLE) -> None:
    """Until the kubelet holds ``units``, all healthy (a guard of ``timeout`` s)."""
    await kubelet.wait_for_devices(
        RESOURCE, lambda d: unit_ids(d) == units and all(x.healthy for x in d.values()),
        timeout=timeout)

# -- kubelet restarts ---------------------------------------------------------------------


@pytest.mark.parametrize("downtime", [0.5, 5.0, 15.0])
async def test_kubelet_killed_and_replaced_without_wipe_is_met_at_once(
        kubelet, plugin, downtime):
    """How soon is bench/failover.py's ("crashed kubelet replaced, directory not wiped")."""
    # SIGKILL leaves kubelet.sock behind; the plugin's rounds against it fail and back off.
    # The next kubelet does not delete the plugin's socket, so only its new kubelet.sock
    # tells the plugin: that must be enough, whatever the retry loop is doing then.
    node = await kubelet("1.26")
    daemon = plugin(fast_retries=False)  # the back-off a real node runs with
    await assert_serves_units(node)
    await node.crash()
    await asyncio.sleep(downtime)
    replacement = await kubelet("1.26", wipe_at_start=False)
    await replacement.wait_for_devices(RESOURCE, timeout=SETTLE)
    assert daemon.alive


async def test_200_kubelet_restarts_across_generations(kubelet, plugin):
    """How soon each is met is bench/core.py's ("re-registration after kubelet restart")."""
    models = ("1.8", "1.9", "1.10", "1.26")
    node = await kubelet("1.26")
    daemon = plugin(fast_retries=False)
    await assert_serves_units(node)
    baseline: tuple[int, int] | None = None
    for round_number in range(200):
        crash = round_number % 2 == 1
        if crash:
            await node.crash()
        else:
            await node.stop()
        model = models[round_number % len(models)]
        node = await kubelet(model, wipe_at_start=round_number % 3 != 0)
        await until_served(node)
        if round_number == 20:
            baseline = resources_of(daemon)
    assert daemon.alive
    assert baseline is not None
    fds, threads = resources_of(daemon)
    assert fds <= baseline[0] + 2, f"descriptors grew from {baseline[0]} to {fds}"
    assert threads <= baseline[1] + 2, f"threads grew from {baseline[1]} to {threads}"


async def test_20000_allocates_leave_memory_and_descriptors_flat(kubelet, plugin):
    node = await kubelet("1.26")
    daemon = plugin()
    await assert_serves_units(node)
    for _ in range(2000):  # warm up caches and gRPC's buffers first
        await node.allocate(RESOURCE, ["1"])
    before_rss, before = rss_kib(daemon), resources_of(daemon)
    for index in range(20000):
        await node.allocate(RESOURCE, [ALL_UNITS[index % 4]])
    growth = rss_kib(daemon) - before_rss
    print(f"RSS growth over 20,000 Allocates: {growth} KiB")
    assert growth < 2048, f"RSS grew by {growth} KiB over 20,000 Allocates"
    fds, threads = resources_of(daemon)
    assert fds <= before[0] + 2 and threads <= before[1] + 2
    assert daemon.alive


# -- two instances ------------------------------------------------------------------------


async def holder_and_newcomer(kubelet, plugin):
    """A registered instance, and a second one on the same socket that says it waits."""
    node = await kubelet("1.26")
    old = plugin(name="old")
    await assert_serves_units(node)
    new = plugin(name="new")
    await new.wait_for_log(lambda e: "Waiting for it to stop" in e.get("message", ""),
                           what="the newcomer saying it waits")
    return node, old, new


async def test_rolling_update_with_surge_hands_over_once(kubelet, plugin):
    """maxSurge 1: the new pod starts while the old one serves; the old one then stops.
    How soon capacity is back is bench/failover.py's."""
    node, old, new = await holder_and_newcomer(kubelet, plugin)
    assert f"process {old.pid}" in "".join(messages(new))
    await asyncio.sleep(3.0)  # no fight: the old one keeps its socket and its registration
    assert len(node.registrations) == 1
    assert old.socket_path.exists() and node.is_connected(RESOURCE)

    assert await old.terminate() == 0
    await node.wait_for_registrations(2, timeout=SETTLE)
    await node.wait_for_devices(RESOURCE, timeout=SETTLE)
    await asyncio.sleep(2.0)
    assert len(node.registrations) == 2, "exactly one handover, no flapping"
    assert (await node.allocate(RESOURCE, ["2"])).envs["ACCELERATOR_UNITS"] == "2"
    assert new.alive


async def test_newcomer_takes_over_from_a_killed_instance(kubelet, plugin):
    """How soon is bench/failover.py's ("handover to a waiting instance, old one killed")."""
    node, old, new = await holder_and_newcomer(kubelet, plugin)
    old.kill()  # SIGKILL: its socket file stays, nobody answers on it
    await node.wait_for_registrations(2, timeout=SETTLE)
    await node.wait_for_devices(RESOURCE, timeout=SETTLE)
    assert any("replacing stale" in m for m in messages(new))


async def test_two_instances_through_kubelet_restarts_never_flap(kubelet, plugin):
    node, first, second = await holder_and_newcomer(kubelet, plugin)
    for _ in range(8):
        await node.stop()
        node = await kubelet("1.26")  # deletes the holder's socket: either may take it
        await node.wait_for_devices(RESOURCE, timeout=SETTLE)
        await asyncio.sleep(1.0)
        assert len(node.registrations) == 1, node.registrations
    assert first.alive and second.alive


# -- directories, signals -----------------------------------------------------------------


async def test_directory_watcher_rearms_once_the_directory_can_be_watched(
        sockdir, logdir, kubelet):
    blocker = sockdir / "kubelet"
    blocker.write_text("not a directory yet\n")  # mkdir and inotify both fail below it
    directory = blocker / "dp"
    daemon = PluginProcess(directory, logdir, fast_retries=False, extra=NO_SAFETY_NET).start()
    try:
        await daemon.wait_for_log(
            lambda e: e.get("level") == "error" and "watcher" in e.get("message", ""),
            what="the failing directory watcher reported")
        blocker.unlink()
        directory.mkdir(parents=True)
        from compat_tests.kubelet import KubeletEmulator

        node = KubeletEmulator(directory, "1.26")
        await node.start()
        try:
            await until_served(node)
            await node.stop()
            await node.start()  # no safety net: only a re-armed watcher meets it at all
            await until_served(node)
        finally:
            await node.stop()
        assert daemon.alive
    finally:
        daemon.kill()


async def test_signal_storm_neither_kills_nor_leaves_a_socket(kubelet, plugin):
    node = await kubelet("1.26")
    daemon = plugin()
    await assert_serves_units(node)
    storm = [signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM, signal.SIGPWR, signal.SIGRTMIN,
             signal.SIGRTMIN + 3, signal.SIGVTALRM, signal.SIGPROF]
    for _ in range(20):
        for signum in storm:
            os.kill(daemon.pid, signum)
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.5)
    assert daemon.alive and daemon.socket_path.exists()
    assert len(node.registrations) == 1, "only SIGHUP re-registers"
    assert any("status: b-com.com/accelerator" in m for m in messages(daemon))

    os.kill(daemon.pid, signal.SIGHUP)
    await node.wait_for_registrations(2, timeout=SETTLE)
    await assert_serves_units(node)
    for _ in range(5):
        os.kill(daemon.pid, signal.SIGHUP)
        await asyncio.sleep(0.002)
    await node.wait_for_devices(RESOURCE, timeout=SETTLE)
    assert daemon.alive


@pytest.mark.parametrize("gap", [0.0, 0.005, 0.012, 0.02])
async def test_second_sigterm_during_stop_still_exits_0(kubelet, plugin, gap):
    node = await kubelet("1.26")
    daemon = plugin()
    await assert_serves_units(node)
    os.kill(daemon.pid, signal.SIGTERM)
    await asyncio.sleep(gap)
    os.kill(daemon.pid, signal.SIGTERM)
    assert await daemon.terminate() == 0
    assert not daemon.socket_path.exists()


# -- damaged sysfs under load --------------------------------------------------------------


async def test_damaged_sysfs_files_under_allocate_load(kubelet, plugin, tmp_path):
    """A FIFO, a socket, an oversized file and garbage, while the kubelet keeps allocating."""
    node = FakeNode(tmp_path / "node")
    ports = {bdf: node.add_dfl_card(bdf)[0]
             for bdf in ("0000:3b:00.0", "0000:5e:00.0", "0000:86:00.0", "0000:af:00.0",
                         "0000:d8:00.0")}
    emulated = await kubelet("1.26")
    daemon = plugin(extra=["--backend", "intel", "--sysfs-root", str(node.sysfs_root),
                           "--dev-root", str(node.dev_root), "--rescan-interval", "0.3"])
    await emulated.wait_for_devices(RESOURCE, lambda d: len(d) == 5, timeout=SETTLE)
    baseline = resources_of(daemon)
    healthy = "0000:d8:00.0"
    stop = asyncio.Event()
    granted = 0

    async def allocate_forever() -> None:
        nonlocal granted
        while not stop.is_set():
            answer = await emulated.allocate(RESOURCE, [healthy])
            assert answer.envs["ACCELERATOR_UNITS"] == healthy
            granted += 1
            await asyncio.sleep(0.002)

    load = asyncio.create_task(allocate_forever())
    try:
        port = lambda bdf: node.port_path(ports[bdf])  # noqa: E731
        fifo = port("0000:3b:00.0") / "afu_id"
        fifo.unlink()
        os.mkfifo(fifo)
        errors = port("0000:5e:00.0") / "errors" / "errors"
        errors.unlink()
        with socket.socket(socket.AF_UNIX) as bound:  # bound short, then moved into sysfs
            short = Path(tempfile.mkdtemp(prefix="s", dir="/tmp")) / "s"
            bound.bind(str(short))
            short.rename(errors)
            short.parent.rmdir()
        (port("0000:86:00.0") / "afu_id").write_text("f" * 100_000)
        (port("0000:af:00.0") / "afu_id").write_bytes(b"\xff\xfe garbage \x00\n")
        broken = {"0000:3b:00.0", "0000:5e:00.0", "0000:86:00.0", "0000:af:00.0"}

        def as_expected(devices) -> bool:
            return (len(devices) == 5 and devices[healthy].healthy
                    and all(not devices[b].healthy for b in broken))

        await emulated.wait_for_devices(RESOURCE, as_expected, timeout=SETTLE)
        await asyncio.sleep(2.0)  # several rescans and health re-reads of the damaged files
        assert as_expected(emulated.devices(RESOURCE))
    finally:
        stop.set()
        await load
    assert granted > 50 and daemon.alive
    fds, threads = resources_of(daemon)
    assert fds <= baseline[0] + 2 and threads <= baseline[1] + 2
    assert await daemon.terminate() == 0


# -- hostile requests ---------------------------------------------------------------------


async def preferred_directly(socket_path: Path, available: list[str], must_include: list[str],
                             size: int) -> list[str]:
    """GetPreferredAllocation as any client on the node could send it."""
    wire = WireApi.load("v1beta1")
    method = wire.method("DevicePlugin", "GetPreferredAllocation")
    request = wire.new("PreferredAllocationRequest", container_requests=[wire.new(
        "ContainerPreferredAllocationRequest", available_deviceIDs=available,
        must_include_deviceIDs=must_include, allocation_size=size)])
    async with grpc.aio.insecure_channel(f"unix://{socket_path}") as channel:
        answer = await client_call(channel, method)(request, timeout=10)
    return list(answer.container_responses[0].deviceIDs)


@pytest.mark.parametrize("log_format", ["text", "json"])
async def test_hostile_requests_are_refused_in_bounded_words(kubelet, plugin, log_format):
    node = await kubelet("1.26")
    daemon = plugin(extra=["--log-format", log_format])
    await assert_serves_units(node)

    with pytest.raises(PluginCallError) as many:
        await node.allocate(RESOURCE, [f"no-such-{i}" for i in range(10_000)])
    assert many.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "and 9,995 more" in many.value.details and len(many.value.details) < 1024

    with pytest.raises(PluginCallError) as huge:
        await node.allocate(RESOURCE, ["h" * (1 << 20)])
    assert huge.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "(1,048,576 characters)" in huge.value.details

    forged = "0\n2026-01-01 00:00:00,000 INFO    plugin.process.daemon: all is well"
    with pytest.raises(PluginCallError):
        await node.allocate(RESOURCE, [forged, "\x1b[2J"])

    # Units carry no topology, so the kubelet is never told to call this; any client can.
    chosen = await preferred_directly(daemon.socket_path, ["1", "2"], ["9", "1"], 2)
    assert chosen == ["1", "2"], "never an ID that is not available and owned"
    assert await preferred_directly(daemon.socket_path, ALL_UNITS, [], -1) == []

    await asyncio.sleep(0.2)
    assert daemon.alive
    lines = daemon.text().splitlines()
    assert max(len(line) for line in lines) < 4096, "no log line of megabytes"
    assert not any("all is well" in line and line.startswith("2026-01-01") for line in lines)
    assert not any("\x1b" in line for line in lines)
    assert (await node.allocate(RESOURCE, ["0"])).envs["ACCELERATOR_UNITS"] == "0"
