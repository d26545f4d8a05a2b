"""Discovery faults, against the real ``serve`` process and an emulated kubelet.

Each case breaks the fake sysfs tree the way a buggy driver or a corrupted node can, and
asserts what the kubelet sees: the other devices stay advertised, the broken one is reported
Unhealthy rather than Healthy, the plugin recovers when the fault clears and still stops
with exit 0 on SIGTERM.
"""

from __future__ import annotations

import asyncio
import os
import textwrap
import time
from pathlib import Path

import pytest

from compat_tests.fake_sysfs import DEFAULT_AFU_ID, FakeNode
from compat_tests.plugin_process import PluginProcess, run_at_start_up

RESOURCE = "b-com.com/accelerator"
JOB_BEFORE_HANG = 0.1
"""How long a scan or re-read may have run before reaching its first read that hangs."""
SETTLE = 15.0
"""Guards against hangs on a loaded 2-core machine; not a performance target."""
HUGE_NUMA = "99999999999999999999"


def intel_flags(node: FakeNode, *more: str) -> list[str]:
    return ["--backend", "intel", "--sysfs-root", str(node.sysfs_root),
            "--dev-root", str(node.dev_root), "--health-interval", "0.2", *more]


def messages(daemon: PluginProcess, level: str) -> list[str]:
    return [e.get("message", "") for e in daemon.entries() if e.get("level") == level]


def threads_and_fds(pid: int) -> tuple[int, int]:
    status = Path(f"/proc/{pid}/status").read_text()
    threads = next(int(line.split()[1]) for line in status.splitlines()
                   if line.startswith("Threads:"))
    return threads, len(os.listdir(f"/proc/{pid}/fd"))


async def stops_promptly(daemon: PluginProcess) -> None:
    """SIGTERM ends it with exit 0 and its last word, even with a read hanging: it never
    waits on the hung call (it would wait for ever: ``terminate`` fails after SETTLE s,
    a guard, not a target). How fast it stops is bench/stopping.py's."""
    assert await daemon.terminate(timeout=SETTLE) == 0
    assert any("stopped; sockets removed" in m for m in messages(daemon, "info")), \
        daemon.text()[-3000:]


@pytest.mark.parametrize("model", ["1.9", "1.26"])
async def test_a_numa_node_beyond_int64_costs_nothing_but_its_topology(
    kubelet, plugin, tmp_path, model,
) -> None:
    node = FakeNode(tmp_path / "node")
    node.add_opae_card("0000:5e:00.0", numa_node=0)
    node.add_dfl_card("0000:d8:00.0", numa_node=1)
    numa = node.function_path("0000:d8:00.0") / "numa_node"
    numa.write_text(HUGE_NUMA + "\n")
    emulated = await kubelet(model)
    daemon = plugin(extra=intel_flags(node, "--rescan-interval", "0.3"))

    devices = await emulated.wait_for_devices(
        RESOURCE, lambda d: len(d) == 2 and all(x.healthy for x in d.values()), timeout=SETTLE)
    if emulated.model.reads_topology:
        assert devices["0000:5e:00.0"].numa_nodes == (0,)
        assert devices["0000:d8:00.0"].numa_nodes == ()
    await asyncio.sleep(1.0)  # several rescans and re-sends
    assert emulated.is_connected(RESOURCE), "the ListAndWatch stream failed"
    assert len(emulated.registrations) == 1
    assert (await emulated.allocate(RESOURCE, ["0000:d8:00.0"])).envs
    warned = [m for m in messages(daemon, "warning") if str(numa) in m]
    assert len(warned) == 1, warned
    assert not messages(daemon, "error")
    await stops_promptly(daemon)


def replace_with_fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def replace_with_file(path: Path, text: str) -> None:
    spare = path.with_name(path.name + ".new")
    spare.write_text(text + "\n")
    spare.replace(path)


async def test_a_fifo_in_sysfs_neither_wedges_discovery_nor_stops_exit(
    kubelet, plugin, tmp_path,
) -> None:
    node = FakeNode(tmp_path / "node")
    [port] = node.add_opae_card("0000:5e:00.0", numa_node=0)
    afu_id = node.port_path(port) / "afu_id"
    emulated = await kubelet("1.26")
    daemon = plugin(extra=intel_flags(node, "--rescan-interval", "1"))
    await emulated.wait_for_devices(RESOURCE, timeout=SETTLE)

    replace_with_fifo(afu_id)
    devices = await emulated.wait_for_devices(
        RESOURCE, lambda d: not d["0000:5e:00.0"].healthy, timeout=SETTLE)
    assert list(devices) == ["0000:5e:00.0"]
    await daemon.wait_for_log(
        lambda e: e.get("level") == "warning" and "afu_id" in e.get("message", "")
        and "not a regular file" in e.get("message", ""), what="warning naming the FIFO")

    # Still watching: a port plugged in now is advertised.
    node.add_dfl_card("0000:d8:00.0", numa_node=1)
    await emulated.wait_for_devices(
        RESOURCE, lambda d: "0000:d8:00.0" in d and d["0000:d8:00.0"].healthy, timeout=SETTLE)
    # A rescan of the finished tree first: the scan the new port's device node woke may have
    # run while its files were still being written, and kept fewer health files open.
    await asyncio.sleep(1.2)
    before = threads_and_fds(daemon.pid)
    await asyncio.sleep(1.5)  # several health re-reads and a rescan with the FIFO in place
    assert threads_and_fds(daemon.pid) == before

    replace_with_file(afu_id, DEFAULT_AFU_ID)
    await emulated.wait_for_devices(
        RESOURCE, lambda d: len(d) == 2 and all(x.healthy for x in d.values()), timeout=SETTLE)

    replace_with_fifo(afu_id)  # and stopping while it is there
    await emulated.wait_for_devices(
        RESOURCE, lambda d: not d["0000:5e:00.0"].healthy, timeout=SETTLE)
    await stops_promptly(daemon)


HANGING_READS = textwrap.dedent('''
    """Test-only: reads of afu_id files hang while a marker file exists, like a wedged driver.

    The plugin's own reads never block on what a tree can hold (FIFOs included), so a read
    the kernel does not answer is simulated under the plugin's sysfs module.
    """
    import os
    import time

    import plugin.discovery.backends.sysfs as sysfs

    MARKER = os.environ["DP_TEST_HANG_MARKER"]


    class HangingOs:
        def __init__(self):
            self.hanging = set()

        def __getattr__(self, name):
            return getattr(os, name)

        def open(self, path, flags, *args):
            fd = os.open(path, flags, *args)
            (self.hanging.add if str(path).endswith("afu_id") else self.hanging.discard)(fd)
            return fd

        def read(self, fd, size):
            while fd in self.hanging and os.path.exists(MARKER):
                time.sleep(0.02)
            return os.read(fd, size)


    sysfs.os = HangingOs()
''')


async def test_a_hanging_sysfs_read_turns_devices_unhealthy_until_it_returns(
    kubelet, plugin, tmp_path, monkeypatch,
) -> None:
    node = FakeNode(tmp_path / "node")
    node.add_opae_card("0000:5e:00.0", numa_node=0)
    node.add_dfl_card("0000:d8:00.0", numa_node=1)
    run_at_start_up(HANGING_READS, tmp_path / "inject", monkeypatch)
    marker = tmp_path / "hang"
    monkeypatch.setenv("DP_TEST_HANG_MARKER", str(marker))
    emulated = await kubelet("1.26")
    daemon = plugin(extra=intel_flags(node, "--scan-stall-timeout", "1",
                                      "--rescan-interval", "0.5"))
    await emulated.wait_for_devices(
        RESOURCE, lambda d: len(d) == 2 and all(x.healthy for x in d.values()), timeout=SETTLE)

    marker.touch()
    hung_at = time.monotonic()
    await emulated.wait_for_devices(
        RESOURCE, lambda d: len(d) == 2 and not any(x.healthy for x in d.values()),
        timeout=SETTLE)
    # The stall is timed from the start of the scan or re-read that hangs, which may have
    # begun a little before the marker appeared (its first reads did not hang yet): allow
    # it that little, never a large part of the timeout.
    assert time.monotonic() - hung_at >= 1.0 - JOB_BEFORE_HANG, \
        "Unhealthy before the stall timeout"
    errors = messages(daemon, "error")
    assert any("has not returned" in m and "afu_id" in m for m in errors), errors
    assert any("Unhealthy" in m for m in errors), errors
    before = threads_and_fds(daemon.pid)
    await asyncio.sleep(1.5)  # health intervals and rescans come due meanwhile
    assert threads_and_fds(daemon.pid) == before, "work piled up behind the hanging read"
    assert emulated.is_connected(RESOURCE)

    marker.unlink()
    await emulated.wait_for_devices(
        RESOURCE, lambda d: len(d) == 2 and all(x.healthy for x in d.values()), timeout=SETTLE)
    assert any("answers again" in m for m in messages(daemon, "warning"))

    marker.touch()  # hang again, and stop while the read hangs
    await emulated.wait_for_devices(
        RESOURCE, lambda d: not any(x.healthy for x in d.values()), timeout=SETTLE)
    await stops_promptly(daemon)
