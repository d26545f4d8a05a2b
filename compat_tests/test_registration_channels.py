"""Both registration channels against emulated kubelets: kubelet.sock and the plugin watcher.

The real ``serve`` process; kubelets whose plugin manager reconciles every 0.1 s (a real one
reconciles every second) so the watcher cases stay quick.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from compat_tests.kubelet import KubeletEmulator

RESOURCE = "b-com.com/accelerator"
SETTLE = 15.0
RECONCILE = 0.1


def registry_of(sockdir: Path) -> Path:
    return sockdir / "plugins_registry"


def watcher_flags(sockdir: Path, mode: str, wait: float = 1.0) -> list[str]:
    return ["--registration", mode, "--plugins-registry-dir", str(registry_of(sockdir)),
            "--watcher-wait", str(wait)]


async def watching_kubelet(kubelet, sockdir: Path, model: str, **knobs) -> KubeletEmulator:
    return await kubelet(model, plugins_registry=registry_of(sockdir),
                         reconcile_period=RECONCILE, **knobs)


def channels(node: KubeletEmulator) -> list[str]:
    return [r.channel for r in node.registrations if r.resource_name == RESOURCE]


async def test_plugin_watcher_registers_without_kubelet_sock(kubelet, plugin, sockdir):
    node = await watching_kubelet(kubelet, sockdir, "1.32")
    daemon = plugin(nb_units=4, extra=watcher_flags(sockdir, "plugin-watcher"))
    devices = await node.wait_for_devices(RESOURCE, timeout=SETTLE)
    assert sorted(devices) == ["0", "1", "2", "3"]
    assert channels(node) == ["plugin-watcher"]
    assert node.register_calls == 0, "nothing was sent to kubelet.sock"
    assert (registry_of(sockdir) / "accelerator.sock").is_socket()
    assert not (sockdir / "accelerator.sock").exists()
    answer = await node.allocate(RESOURCE, ["2"])
    assert answer.envs["ACCELERATOR_UNITS"] == "2"
    assert await daemon.terminate() == 0
    assert not (registry_of(sockdir) / "accelerator.sock").exists(), "socket removed on stop"


async def test_a_restarted_kubelet_finds_the_watcher_socket_with_no_plugin_action(
        kubelet, plugin, sockdir):
    """How soon is bench/registration.py's ("kubelet restart to devices held")."""
    first = await watching_kubelet(kubelet, sockdir, "1.32")
    daemon = plugin(nb_units=2, extra=watcher_flags(sockdir, "plugin-watcher"))
    await first.wait_for_devices(RESOURCE, timeout=SETTLE)
    await first.stop()
    second = await watching_kubelet(kubelet, sockdir, "1.32")
    await second.wait_for_devices(RESOURCE, timeout=SETTLE)
    assert channels(second) == ["plugin-watcher"] and second.register_calls == 0
    assert "serving and negotiating again" not in daemon.text(), "the plugin did nothing"
    assert daemon.alive


@pytest.mark.parametrize("models", [("1.9", "1.32", "1.9"), ("1.12", "1.26", "1.12")])
async def test_auto_follows_the_kubelet_across_upgrades_and_downgrades(
        kubelet, plugin, sockdir, models):
    """A kubelet without a plugin watcher gets kubelet.sock; one with it gets the watcher;
    decided anew at every kubelet start, with the plugin process untouched."""
    registry_of(sockdir).mkdir()  # present on the node all along, as after an upgrade
    daemon = plugin(nb_units=2, extra=watcher_flags(sockdir, "auto", wait=1.0))
    expected = {"1.9": "kubelet.sock", "1.12": "kubelet.sock", "1.26": "plugin-watcher",
                "1.32": "plugin-watcher"}
    for model in models:
        node = await watching_kubelet(kubelet, sockdir, model)
        await node.wait_for_devices(RESOURCE, timeout=SETTLE)
        assert channels(node) == [expected[model]], model
        await asyncio.sleep(0.5)
        assert len(node.registrations) == 1, f"{model}: registered once, through one channel"
        assert node.is_connected(RESOURCE)
        await node.stop()
    assert daemon.alive


async def test_auto_falls_back_to_kubelet_sock_when_the_watcher_refuses(
        kubelet, plugin, sockdir):
    node = await watching_kubelet(kubelet, sockdir, "1.32",
                                  refuse_watcher=lambda name: "not on this node")
    daemon = plugin(nb_units=2, extra=watcher_flags(sockdir, "auto", wait=5.0))
    await node.wait_for_devices(RESOURCE, timeout=SETTLE)
    assert channels(node) == ["kubelet.sock"]
    assert not (registry_of(sockdir) / "accelerator.sock").exists(), "never both channels"
    await daemon.wait_for_log(lambda e: "not on this node" in e.get("message", ""),
                              what="the kubelet's reason, logged")


async def test_auto_without_a_registry_directory_is_kubelet_sock_at_once(
        kubelet, plugin, sockdir):
    node = await kubelet("1.32")
    daemon = plugin(nb_units=2, extra=watcher_flags(sockdir, "auto", wait=5.0))
    await node.wait_for_devices(RESOURCE, timeout=SETTLE)
    assert channels(node) == ["kubelet.sock"]
    assert "plugin watcher" not in daemon.text(), "no watcher socket, so no watcher wait"


async def test_per_afu_resources_each_get_a_watcher_socket(kubelet, plugin, sockdir, tmp_path):
    from compat_tests.fake_sysfs import OTHER_AFU_ID, FakeNode

    fake = FakeNode(tmp_path / "node")
    fake.add_dfl_card("0000:3b:00.0")
    fake.add_dfl_card("0000:d8:00.0", afu_id=OTHER_AFU_ID)
    node = await watching_kubelet(kubelet, sockdir, "1.32")
    plugin(extra=["--backend", "intel", "--sysfs-root", str(fake.sysfs_root), "--dev-root",
                  str(fake.dev_root), "--resource-mode", "afu",
                  *watcher_flags(sockdir, "plugin-watcher")])
    await node.wait_until(lambda: len(node.registrations) == 2, timeout=SETTLE,
                          what="two resources registered")
    assert {r.channel for r in node.registrations} == {"plugin-watcher"}
    sockets = sorted(p.name for p in registry_of(sockdir).iterdir())
    assert len(sockets) == 2 and all(s.startswith("accelerator-afu-") for s in sockets)


async def test_a_rollout_that_changes_channel_never_registers_both_ways_at_once(
        kubelet, plugin, sockdir):
    """The old instance registered through kubelet.sock; the new one (plugin-watcher) waits
    for it to stop instead of putting a second registration of the resource in the kubelet."""
    node = await watching_kubelet(kubelet, sockdir, "1.32")
    old = plugin(nb_units=2, name="old")
    await node.wait_for_devices(RESOURCE, timeout=SETTLE)
    new = plugin(nb_units=2, name="new", extra=watcher_flags(sockdir, "plugin-watcher"))
    await new.wait_for_log(lambda e: "waiting" in e.get("message", "").lower(),
                           what="the newcomer waiting for the live instance")
    await asyncio.sleep(1.0)
    assert channels(node) == ["kubelet.sock"], "no watcher registration while the old one lives"
    assert not (registry_of(sockdir) / "accelerator.sock").exists()
    assert await old.terminate() == 0
    await node.wait_until(lambda: channels(node) == ["kubelet.sock", "plugin-watcher"]
                          and node.is_connected(RESOURCE), timeout=SETTLE,
                          what="the newcomer registered through the watcher")
    assert new.alive


async def test_a_stale_watcher_socket_is_removed_by_a_kubelet_sock_instance(
        kubelet, plugin, sockdir):
    import socket as sockets

    registry_of(sockdir).mkdir()
    stale = registry_of(sockdir) / "accelerator.sock"
    with sockets.socket(sockets.AF_UNIX) as dead:
        dead.bind(str(stale))  # left behind by a killed watcher-channel instance
    node = await watching_kubelet(kubelet, sockdir, "1.32")
    plugin(nb_units=2, extra=["--plugins-registry-dir", str(registry_of(sockdir))])
    await node.wait_for_devices(RESOURCE, timeout=SETTLE)
    assert channels(node) == ["kubelet.sock"] and not stale.exists()


async def test_a_missing_registry_is_said_once_and_used_once_it_appears(
        kubelet, plugin, sockdir):
    daemon = plugin(nb_units=2, extra=watcher_flags(sockdir, "plugin-watcher"))
    await daemon.wait_for_log(lambda e: "does not exist" in e.get("message", ""),
                              what="the missing registry said")
    await asyncio.sleep(1.0)
    node = await watching_kubelet(kubelet, sockdir, "1.32")  # creates the directory
    await node.wait_for_devices(RESOURCE, timeout=SETTLE)
    assert channels(node) == ["plugin-watcher"]
    said = [e for e in daemon.entries() if "does not exist" in e.get("message", "")]
    assert len(said) == 1 and not [e for e in daemon.entries() if e.get("level") == "error"]


async def test_auto_before_any_kubelet_gives_the_first_kubelet_the_watcher(
        kubelet, plugin, sockdir):
    """At node boot the plugin may start first: the watcher goes unanswered, kubelet.sock is
    absent too; the kubelet that then starts is a new instance and is offered the watcher."""
    registry_of(sockdir).mkdir()
    plugin(nb_units=2, extra=watcher_flags(sockdir, "auto", wait=0.5))
    await asyncio.sleep(2.0)
    node = await watching_kubelet(kubelet, sockdir, "1.32")
    await node.wait_for_devices(RESOURCE, timeout=SETTLE)
    await asyncio.sleep(0.5)
    assert channels(node) == ["plugin-watcher"]
