"""The safety-net rescan pace of the real ``serve`` process, with and without kernel uevents.

A node where the uevent socket cannot be opened (a seccomp profile that refuses netlink, a
kernel built without it) is a state of the node, not a fault to retry: the plugin must say so
once and then find hot-plug by rescanning every few seconds, not restart a listener that can
never work and log an error about it every half minute for ever.
"""

from __future__ import annotations

import asyncio
import subprocess
import textwrap

import pytest

from compat_tests.fake_sysfs import FakeNode
from compat_tests.plugin_process import PluginProcess, run_at_start_up
from compat_tests.test_faults_discovery import RESOURCE, SETTLE, messages, stops_promptly
from tests.system_tools import UTIL_LINUX, needs_tool

REFUSE_NETLINK = textwrap.dedent('''
    """Loaded at start-up from PYTHONPATH: netlink sockets are refused, as a seccomp
    profile would refuse them."""
    import socket

    _Socket = socket.socket


    class _NoNetlink(_Socket):
        def __init__(self, family=-1, type=-1, proto=-1, fileno=None):
            if family == socket.AF_NETLINK:
                raise PermissionError(1, "Operation not permitted")
            super().__init__(family, type, proto, fileno)


    socket.socket = _NoNetlink
''')


def intel(node: FakeNode) -> list[str]:
    return ["--backend", "intel", "--sysfs-root", str(node.sysfs_root),
            "--dev-root", str(node.dev_root)]


async def test_without_uevents_the_plugin_warns_once_and_finds_changes_by_frequent_rescans(
    kubelet, plugin, tmp_path, monkeypatch,
) -> None:
    node = FakeNode(tmp_path / "node")
    node.add_opae_card("0000:5e:00.0", numa_node=0)
    emulated = await kubelet("1.26")
    run_at_start_up(REFUSE_NETLINK, tmp_path / "refuse-netlink", monkeypatch)
    daemon: PluginProcess = plugin(extra=intel(node))
    devices = await emulated.wait_for_devices(RESOURCE, timeout=SETTLE)
    assert devices["0000:5e:00.0"].numa_nodes == (0,)

    # An attribute changed in place gives no event of any kind: only a rescan finds it,
    # and without uevents they come every 5 s.
    (node.function_path("0000:5e:00.0") / "numa_node").write_text("1\n")
    devices = await emulated.wait_for_devices(
        RESOURCE, lambda d: d["0000:5e:00.0"].numa_nodes == (1,), timeout=SETTLE)
    await asyncio.sleep(2.0)  # a supervisor restarting a dead listener would have logged

    warnings = messages(daemon, "warning")
    assert len([m for m in warnings if "uevent socket" in m]) == 1, warnings
    assert warnings.count("rescanning every 5 s while uevent listener 1 cannot hear "
                          "changes") == 1, warnings
    assert not messages(daemon, "error")
    await stops_promptly(daemon)


async def test_in_a_user_namespace_of_its_own_the_plugin_does_not_trust_silence(
    kubelet, sockdir, logdir, tmp_path,
) -> None:
    """A pod with ``hostUsers: false``: the uevent socket binds, and the kernel sends it
    nothing. Taking that silence for a quiet node would leave hot-plug to a 30 s rescan."""
    needs_tool("unshare", UTIL_LINUX)
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "true"],
                           capture_output=True, text=True, timeout=30, check=False)
    if probe.returncode != 0:
        pytest.skip(f"cannot create a user namespace here: {probe.stderr.strip()}")
    node = FakeNode(tmp_path / "node")
    node.add_opae_card("0000:5e:00.0", numa_node=0)
    emulated = await kubelet("1.26")
    daemon = PluginProcess(sockdir, logdir, extra=intel(node), name="userns")
    daemon.args = ["unshare", "--user", "--map-root-user", *daemon.args]
    daemon.start()
    try:
        await emulated.wait_for_devices(RESOURCE, timeout=SETTLE)
        (node.function_path("0000:5e:00.0") / "numa_node").write_text("1\n")
        await emulated.wait_for_devices(
            RESOURCE, lambda d: d["0000:5e:00.0"].numa_nodes == (1,), timeout=SETTLE)
        warned = [m for m in messages(daemon, "warning") if "user namespace" in m]
        assert len(warned) == 1, messages(daemon, "warning")
        assert not messages(daemon, "error")
        await stops_promptly(daemon)
    finally:
        daemon.kill()


REFUSE_WATCHES = textwrap.dedent('''
    """Loaded at start-up from PYTHONPATH: inotify watches under DP_TEST_REFUSED_ROOT fail
    as they do once the node's fs.inotify.max_user_watches is used up."""
    import errno
    import os

    import asyncinotify

    _add_watch = asyncinotify.Inotify.add_watch
    _refused = os.environ["DP_TEST_REFUSED_ROOT"]


    def add_watch(self, path, mask):
        if str(path).startswith(_refused):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return _add_watch(self, path, mask)


    asyncinotify.Inotify.add_watch = add_watch
''')


async def test_a_device_directory_that_cannot_be_watched_is_made_up_for_by_frequent_rescans(
    kubelet, plugin, tmp_path, monkeypatch,
) -> None:
    """With the watch limit reached, a deleted device node gives no event: the default 30 s
    safety net would leave a dead device Healthy for up to half a minute."""
    node = FakeNode(tmp_path / "node")
    [port] = node.add_opae_card("0000:5e:00.0", numa_node=0)
    run_at_start_up(REFUSE_WATCHES, tmp_path / "refuse-watches", monkeypatch)
    monkeypatch.setenv("DP_TEST_REFUSED_ROOT", str(node.dev_root))
    emulated = await kubelet("1.26")
    daemon: PluginProcess = plugin(extra=intel(node))
    await emulated.wait_for_devices(RESOURCE, timeout=SETTLE)
    await daemon.wait_for_log(
        lambda e: "rescanning every 5 s while inotify cannot hear changes" in
        e.get("message", ""), what="the short rescan pace, and why")

    node.delete_device_node(port)
    await emulated.wait_for_devices(
        RESOURCE, lambda d: not d["0000:5e:00.0"].healthy, timeout=SETTLE)
    refused = [m for m in messages(daemon, "warning") if "max_user_watches" in m]
    assert refused and all(str(node.dev_root) in m for m in refused), refused
    assert len(refused) == len(set(refused)), "each refusal is said once"
    assert not messages(daemon, "error")
    await stops_promptly(daemon)


async def test_with_uevents_the_plugin_says_rescans_are_only_a_safety_net(
    kubelet, plugin, tmp_path,
) -> None:
    node = FakeNode(tmp_path / "node")
    node.add_opae_card("0000:5e:00.0", numa_node=0)
    emulated = await kubelet("1.26")
    daemon: PluginProcess = plugin(extra=intel(node))
    await emulated.wait_for_devices(RESOURCE, timeout=SETTLE)
    await daemon.wait_for_log(
        lambda e: "every event source is listening; full rescans every 30 s" in
        e.get("message", ""), what="the safety-net pace")
    assert not messages(daemon, "warning") and not messages(daemon, "error")
    await stops_promptly(daemon)
