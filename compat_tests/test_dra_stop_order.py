"""A rolling update during a load: the old instance gives up its socket only once the load ends.

Two real ``serve`` processes (``maxSurge: 1``) on the world of
:mod:`compat_tests.test_dra_programming_serve`, with stand-in tools that take 4 s per load and
a kubelet that gives each call 1.5 s. The newcomer waits for the old instance's DRA socket.
The old one is sent SIGTERM while it loads a claim's function: it must take no new claim
(each prepare answered that it is stopping, so the kubelet calls again and reaches the
newcomer), let the load end, and only then remove its socket. Otherwise the newcomer would
prepare claims, and program the same card, while the old instance still writes it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from compat_tests.dra_support import until
from compat_tests.fpga_images import NLB3_AFU_ID
from compat_tests.plugin_process import LogEntry, PluginProcess
from compat_tests.test_dra_programming_serve import (
    ALVEO,
    DFL_PORT,
    DRIVER,
    NLB3,
    World,
    function,
    running,
)

IMAGE = "intel/nlb3.gbs"


@pytest.fixture
async def slow(tmp_path: Path, sockdir: Path, logdir: Path) -> AsyncIterator[World]:
    async for world in running(tmp_path, sockdir, logdir, delay=4.0, call_timeout=1.5):
        yield world


def said(words: str) -> object:
    return lambda entry: words in entry.get("message", "")


def first_at(process: PluginProcess, words: str) -> int:
    """Where the first log line saying ``words`` is in ``process``'s log."""
    messages = [entry.get("message", "") for entry in process.entries()]
    return next(i for i, message in enumerate(messages) if words in message)


async def test_a_stop_during_a_load_keeps_the_socket_until_the_load_ends(
        slow: World) -> None:
    world, old = slow, slow.plugin
    newcomer = world.restart("newcomer")
    try:
        await newcomer.wait_for_log(said("Waiting for it to"), 15.0, "the newcomer waiting")
        ref = world.claim("nlb3", DFL_PORT, function(afuID=NLB3_AFU_ID, image=IMAGE))
        first = await world.prepare(ref)
        assert "still loading" in first.error, first.error  # the load goes on
        os.kill(old.pid, signal.SIGTERM)
        await old.wait_for_log(said("stopping"), 10.0, "the stop begun")
        # A claim placed meanwhile: refused by the old instance, saying why.
        plain = await world.prepare(world.claim("plain", ALVEO))
        assert "is stopping" in plain.error and "will call again" in plain.error, plain.error
        await until(lambda: not old.alive, "the old instance gone", 30.0)
        assert old.returncode == 0
        # In the old instance's log: the load ended before the socket went.
        assert first_at(old, "loaded by fpgaconf") < first_at(old, "stopped serving")
        # The newcomer took over after that; the card was not quarantined nor loaded twice.
        world.plugin = newcomer
        dra = world.kubelet.dra
        assert dra is not None
        await newcomer.wait_for_log(said("took over"), 15.0, "the newcomer took over")
        await dra.wait_until(lambda: dra.endpoints(DRIVER), 15.0, "the newcomer registered")
        again = await world.prepare(ref)
        assert again.ok, again.error
        assert len(world.tools.invocations("fpgaconf")) == 1
        await until(lambda: world.published()[DFL_PORT]["afuID"] == NLB3, "nlb3 published")
        assert not world.published()[DFL_PORT]["taints"]
        assert not any(_quarantined(e) for e in old.entries() + newcomer.entries())
    finally:
        newcomer.kill()


def _quarantined(entry: LogEntry) -> bool:
    return "is Unhealthy" in entry.get("message", "")
