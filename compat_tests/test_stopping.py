"""Stopping while something is in flight: nothing may register once the plugin is stopping.

A stop that arrives during a SIGHUP-triggered registration used to let that registration
finish after ``stopping`` was logged: the daemon took down its own loops first and told the
resource servers last, so a Register answered in between was held as if nothing had happened.
A kubelet then kept a registration for a plugin on its way out. Run against the real
``serve`` process; a directory watch that takes its time to close makes the gap long enough
to see every time.
"""

from __future__ import annotations

import asyncio
import os
import signal

from compat_tests.plugin_process import run_at_start_up
from compat_tests.test_matrix import SETTLE, assert_serves_units

SLOW_TO_CLOSE = """
import asyncio
from plugin.process import dirwatch

_events = dirwatch.DirectoryWatcher.events

async def _slow_to_close(self):
    try:
        async for event in _events(self):
            yield event
    finally:
        await asyncio.sleep(0.5)  # a watch that takes its time to close

dirwatch.DirectoryWatcher.events = _slow_to_close
"""


def after_stopping(messages: list[str]) -> list[str]:
    return messages[messages.index("stopping"):]


async def test_a_stop_cancels_a_sighup_registration_in_flight(
        kubelet, plugin, tmp_path, monkeypatch):
    run_at_start_up(SLOW_TO_CLOSE, tmp_path / "inject", monkeypatch)
    node = await kubelet("1.26")
    daemon = plugin()
    await assert_serves_units(node)
    node.hold_register()
    calls = node.register_calls
    os.kill(daemon.pid, signal.SIGHUP)
    async with asyncio.timeout(SETTLE):
        while node.register_calls == calls:
            await asyncio.sleep(0.01)
    os.kill(daemon.pid, signal.SIGTERM)
    await daemon.wait_for_log(lambda e: e.get("message") == "stopping", what="stopping")
    node.release_register()  # the kubelet answers while the plugin is stopping
    assert await daemon.terminate() == 0
    messages = [e.get("message", e.get("raw", "")) for e in daemon.entries()]
    assert not [m for m in after_stopping(messages) if "registered" in m], messages
    await asyncio.sleep(0.2)
    assert len(node.registrations) == 1, "the kubelet completed a registration after stop"
    assert not daemon.socket_path.exists()


async def test_a_stop_during_the_first_registration_registers_nothing(
        kubelet, plugin, tmp_path, monkeypatch):
    run_at_start_up(SLOW_TO_CLOSE, tmp_path / "inject", monkeypatch)
    node = await kubelet("1.26")
    node.hold_register()
    daemon = plugin()
    async with asyncio.timeout(SETTLE):
        while node.register_calls == 0:
            await asyncio.sleep(0.01)
    os.kill(daemon.pid, signal.SIGTERM)
    await daemon.wait_for_log(lambda e: e.get("message") == "stopping", what="stopping")
    node.release_register()
    assert await daemon.terminate() == 0
    messages = [e.get("message", e.get("raw", "")) for e in daemon.entries()]
    assert not [m for m in after_stopping(messages) if "registered" in m], messages
    await asyncio.sleep(0.2)
    assert node.registrations == []
