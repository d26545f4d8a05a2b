"""A rolling update against a kubelet with upstream's client handling (1.25 on).

``handler.go``'s ``runClient`` disconnects the newest client of a resource when an older
client's stream ends (see ``compat_tests/kubelet/clients.py``), so the new instance must
register only after the kubelet has handled the old one's stream end, and then at once. The
old instance removes its socket only once the kubelet has dropped its connection (which the
kubelet does right after handling the end); the newcomer registers on that removal. These
tests check the order and its cause, never how long it took (that is ``bench/handover.py``).
"""

from __future__ import annotations

import asyncio

import pytest

from compat_tests.test_matrix import RESOURCE, SETTLE, assert_serves_units
from compat_tests.test_reliability import holder_and_newcomer, messages

KUBELET_BUSY = 0.6
"""How long the emulated kubelet takes to handle the old stream's end: longer than the pause
a newcomer used to take before registering, shorter than the old instance waits for it."""


def delay_stream_ends(node, seconds: float) -> None:
    """Make ``node`` handle every ListAndWatch end ``seconds`` late, as a busy kubelet whose
    ``runClient`` goroutine runs late; its connection to the plugin closes only then too."""
    handle = node._on_stream_end
    loop = asyncio.get_running_loop()
    node._on_stream_end = lambda endpoint, reason: loop.call_later(
        seconds, handle, endpoint, reason)


@pytest.mark.parametrize("model", ["1.26", "1.36"])
async def test_roll_waits_for_the_kubelet_to_handle_the_old_stream_end(kubelet, plugin, model):
    node = await kubelet(model)
    delay_stream_ends(node, KUBELET_BUSY)  # before the old one registers: bound at install
    old = plugin(name="old")
    await assert_serves_units(node)
    new = plugin(name="new")
    await new.wait_for_log(lambda e: "Waiting for it to stop" in e.get("message", ""),
                           what="the newcomer saying it waits")
    node.clients.timeline.clear()
    assert await old.terminate() == 0
    await node.wait_for_registrations(2, timeout=SETTLE)
    await node.wait_for_devices(RESOURCE, timeout=SETTLE)
    await asyncio.sleep(KUBELET_BUSY + 0.3)  # any late stream end has been handled by now

    assert node.clients.dropped_by_older == [], "the old stream's end dropped the new plugin"
    devices = node.devices(RESOURCE)
    assert devices and all(d.healthy for d in devices.values()), devices
    ended = [m for m in node.clients.timeline if m.healthy is None]
    heard = [m for m in node.clients.timeline if m.healthy]
    assert len(ended) == 1 and heard, node.clients.timeline
    assert heard[0].at > ended[0].at and heard[0].endpoint is not ended[0].endpoint
    assert len(node.registrations) == 2 and new.alive


async def test_newcomer_registers_on_the_socket_removal_without_a_pause(kubelet, plugin):
    """The old instance promised the order, so the newcomer's registration is caused by the
    removal itself, not by a pause or a poll running out."""
    node, old, new = await holder_and_newcomer(kubelet, plugin)
    assert await old.terminate() == 0
    await node.wait_for_registrations(2, timeout=SETTLE)
    took_over = [m for m in messages(new) if "took over" in m]
    assert len(took_over) == 1 and "registering at once" in took_over[0], took_over
    assert node.clients.dropped_by_older == []


async def test_newcomer_pauses_after_a_killed_holder(kubelet, plugin):
    """A killed holder promised nothing it could keep: its socket is left behind, and the
    newcomer keeps the pause before registering."""
    node, old, new = await holder_and_newcomer(kubelet, plugin)
    old.kill()
    await node.wait_for_registrations(2, timeout=SETTLE)
    await node.wait_for_devices(RESOURCE, timeout=SETTLE)
    took_over = [m for m in messages(new) if "took over" in m]
    assert len(took_over) == 1 and "after a pause" in took_over[0], took_over


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory):
    from compat_tests.previous_release import previous_release_tree

    return previous_release_tree(tmp_path_factory.mktemp("releases"))


async def test_upgrade_from_the_previous_release_keeps_the_pause(kubelet, plugin, previous):
    """Release 0.1.0 removes its socket without waiting for the kubelet, and says nothing
    about it: the newcomer of this release pauses before registering, as before."""
    node = await kubelet("1.26")
    old = plugin(name="release-0.1.0", source=previous)
    await assert_serves_units(node)
    new = plugin(name="new")
    await new.wait_for_log(lambda e: "Waiting for it to stop" in e.get("message", ""),
                           what="the newcomer saying it waits")
    assert await old.terminate() == 0
    await node.wait_for_registrations(2, timeout=SETTLE)
    await node.wait_for_devices(RESOURCE, timeout=SETTLE)
    took_over = [m for m in messages(new) if "took over" in m]
    assert len(took_over) == 1 and "after a pause" in took_over[0], took_over
