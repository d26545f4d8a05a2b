"""The HTTP probes (``--probe-port``) of the real ``serve`` process, as a kubelet sees them.

``/livez`` follows the serve loops: 200 while every socket answers its self-check, 503 when
the event loop is wedged or a socket stops answering (faults put in front of the real process
through ``sitecustomize``, as the other fault tests do). ``/readyz`` follows the node: 503
until the kubelet holds the resource, 503 again when that kubelet goes away, 200 while a
rolling update's newcomer waits for the old instance; under DRA, 503 until the pool is
published. A probe port already taken ends the start with one line and exit 2, and
``build_info`` is on ``/metrics``.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from compat_tests.dra_bench import DRIVER, Bench
from compat_tests.dra_support import until
from compat_tests.plugin_process import PluginProcess, run_at_start_up
from compat_tests.test_dra_auto import cluster, mapped_node
from compat_tests.test_matrix import RESOURCE, SETTLE, assert_serves_units
from plugin.version import VERSION

FAST_HEARTBEAT = ("--heartbeat-interval", "0.2", "--heartbeat-max-age", "1")
"""Self-checks every 0.2 s, stale after 1 s: a wedge shows within seconds."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def probe_flags(port: int) -> list[str]:
    return ["--probe-port", str(port), "--probe-address", "127.0.0.1", *FAST_HEARTBEAT]


def get(port: int, path: str) -> tuple[int, str]:
    """Status and body of ``GET path``, as the kubelet's httpGet probe reads them."""
    try:
        with DIRECT.open(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except urllib.error.URLError as error:  # not listening yet
        return 0, str(error.reason)


DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
"""No proxy from the environment between a probe and the process, as for the kubelet."""


async def answers(plugin: PluginProcess, port: int, path: str, status: int,
                  words: str = "", timeout: float = SETTLE) -> str:
    """Poll ``path`` until it answers ``status`` with ``words`` in its body; its body."""
    seen: list[tuple[int, str]] = []

    async def holds() -> bool:
        assert plugin.alive, f"serve died:\n{plugin.text()[-4000:]}"
        seen.append(await asyncio.to_thread(get, port, path))
        return seen[-1][0] == status and words in seen[-1][1]

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await holds():
        if loop.time() > deadline:
            raise AssertionError(f"{path} never answered {status} {words!r} within {timeout} "
                                 f"s; last: {seen[-1]}\nplugin log:\n{plugin.text()[-4000:]}")
        await asyncio.sleep(0.1)
    return seen[-1][1]


def healthcheck(heartbeat: Path) -> int:
    return subprocess.run(
        [sys.executable, "-m", "plugin", "healthcheck", "--heartbeat-file", str(heartbeat),
         "--heartbeat-max-age", "5"], capture_output=True, timeout=60).returncode


# -- the device plugin ----------------------------------------------------------------------


async def test_readyz_follows_registration_with_the_kubelet_that_runs(kubelet, plugin,
                                                                     tmp_path):
    port, heartbeat = free_port(), tmp_path / "heartbeat"
    serve = plugin(extra=[*probe_flags(port), "--heartbeat-file", str(heartbeat)])
    assert "self-check passed" in await answers(serve, port, "/livez", 200)
    assert (await asyncio.to_thread(get, port, "/healthz"))[0] == 200
    await answers(serve, port, "/readyz", 503, f"{RESOURCE}: not registered")

    node = await kubelet("1.26")
    await assert_serves_units(node)
    await answers(serve, port, "/readyz", 200, f"{RESOURCE}: registered through v1beta1")

    await node.stop()  # kubelet.sock gone: nobody holds the devices now
    await answers(serve, port, "/readyz", 503, "with a kubelet that is gone")
    assert (await asyncio.to_thread(get, port, "/livez"))[0] == 200, "still live"

    node = await kubelet("1.9")
    await answers(serve, port, "/readyz", 200, f"{RESOURCE}: registered through v1alpha2")
    # The exec probe reads the same self-checks, as before.
    assert await asyncio.to_thread(healthcheck, heartbeat) == 0
    assert (await asyncio.to_thread(get, port, "/nothing"))[0] == 404


WEDGE = """
import asyncio.base_events, os, threading, time

TRIGGER = {trigger!r}
_run_forever = asyncio.base_events.BaseEventLoop.run_forever


def run_forever(self):
    # A synchronous call that never returns, made on the event loop once TRIGGER exists:
    # what a hung library call or an endless loop in a callback does to the process.
    def wedge_when_asked():
        while not os.path.exists(TRIGGER):
            time.sleep(0.05)
        self.call_soon_threadsafe(time.sleep, 3600)

    threading.Thread(target=wedge_when_asked, daemon=True).start()
    return _run_forever(self)


asyncio.base_events.BaseEventLoop.run_forever = run_forever
"""


async def test_livez_fails_when_the_event_loop_is_wedged(kubelet, plugin, tmp_path,
                                                         monkeypatch):
    trigger = tmp_path / "wedge"
    run_at_start_up(textwrap.dedent(WEDGE.format(trigger=str(trigger))), tmp_path / "site",
                    monkeypatch)
    port = free_port()
    node = await kubelet("1.26")
    serve = plugin(extra=probe_flags(port))
    await assert_serves_units(node)
    await answers(serve, port, "/readyz", 200)
    trigger.touch()
    body = await answers(serve, port, "/livez", 503, "no self-check for")
    assert "the event loop or a self-check is stuck" in body
    await answers(serve, port, "/readyz", 503, "the event loop did not answer")
    assert serve.alive  # wedged, not dead: only the probe can tell


HANGING_SELF_CHECK = """
import asyncio, os
from grpc_health.v1.health import aio as health_aio

TRIGGER = {trigger!r}
_check = health_aio.HealthServicer.Check


async def Check(self, request, context):
    # While TRIGGER exists the socket's server answers no health check: the event loop
    # runs, the socket is there, and the gRPC round trip never comes back.
    while os.path.exists(TRIGGER):
        await asyncio.sleep(0.1)
    return await _check(self, request, context)


health_aio.HealthServicer.Check = Check
"""


async def test_livez_fails_while_a_socket_fails_its_self_check(kubelet, plugin, tmp_path,
                                                              monkeypatch):
    trigger = tmp_path / "hang"
    run_at_start_up(textwrap.dedent(HANGING_SELF_CHECK.format(trigger=str(trigger))),
                    tmp_path / "site", monkeypatch)
    port = free_port()
    node = await kubelet("1.26")
    serve = plugin(extra=probe_flags(port))
    await assert_serves_units(node)
    await answers(serve, port, "/livez", 200)
    trigger.touch()
    body = await answers(serve, port, "/livez", 503, "self-check failed")
    assert f"{RESOURCE} did not answer on its socket" in body, body
    await answers(serve, port, "/readyz", 503, "not live")
    trigger.unlink()
    await answers(serve, port, "/livez", 200)
    await answers(serve, port, "/readyz", 200)


async def test_a_newcomer_waiting_for_the_socket_is_ready(kubelet, plugin):
    """A rolling update with surge stops the old pod once the new one is ready: a newcomer
    that waited to be registered before saying ready would wait for ever."""
    old_port, new_port = free_port(), free_port()
    node = await kubelet("1.26")
    old = plugin(name="old", extra=probe_flags(old_port))
    await assert_serves_units(node)
    new = plugin(name="new", extra=probe_flags(new_port))
    body = await answers(new, new_port, "/readyz", 200, f"served by process {old.pid}")
    assert "takes over when it stops" in body
    await answers(new, new_port, "/livez", 200)
    assert await old.terminate() == 0
    await answers(new, new_port, "/readyz", 200, "registered through v1beta1")


async def test_a_probe_port_already_taken_exits_2_with_one_line(plugin):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        serve = plugin(extra=probe_flags(port))
        await until(lambda: not serve.alive, "serve exited", SETTLE)
    assert serve.returncode == 2
    lines = serve.text().strip().splitlines()
    assert lines == [f"accelerator-device-plugin serve: error: --probe-port {port}: cannot "
                     f"listen on 127.0.0.1:{port}: Address already in use"], lines


async def test_build_info_is_on_metrics(plugin):
    port = free_port()
    serve = plugin(extra=["--metrics-port", str(port), "--metrics-address", "127.0.0.1"])
    body = await answers(serve, port, "/metrics", 200, "build_info")
    python = ".".join(map(str, sys.version_info[:3]))
    assert (f'accelerator_device_plugin_build_info{{python="{python}",version="{VERSION}"}} '
            "1.0") in body.splitlines(), body


# -- DRA ------------------------------------------------------------------------------------


@pytest.fixture
def bench(dra_bench: Bench) -> Bench:
    """One node of emulated Kubernetes and a fake FPGA tree (compat_tests/conftest.py)."""
    return dra_bench


async def test_dra_readyz_follows_the_pool(bench):
    await bench.start_api()
    await bench.start_kubelet()
    bench.api.faults.deny("create", "resourceslices")
    port = free_port()
    serve = bench.serve(bench.kubeconfig(), extra=probe_flags(port))
    await answers(serve, port, "/livez", 200)
    body = await answers(serve, port, "/readyz", 503, 'cannot create resource "resourceslices"')
    assert body.startswith("failing: the pool of node node-a is not published: "), body
    bench.api.faults.allow("create", "resourceslices")
    await bench.published(serve)
    body = await answers(serve, port, "/readyz", 200, "the pool of node node-a is published")
    assert f"driver {DRIVER}" in body


async def test_a_dra_newcomer_waiting_for_the_socket_is_live_and_ready(bench, tmp_path):
    """Before, its self-check failed while it waited, so its heartbeat was never written:
    the exec probe failed too, and a rolling update never got past it."""
    first = await bench.up()
    port, heartbeat = free_port(), tmp_path / "second-heartbeat"
    second = bench.serve(bench.kubeconfig(), name="second", extra=[
        *probe_flags(port), "--heartbeat-file", str(heartbeat)])
    await second.wait_for_log(lambda e: "Waiting for it to stop" in e.get("message", ""),
                              what="the newcomer waiting for the socket")
    await answers(second, port, "/livez", 200)
    await answers(second, port, "/readyz", 200, f"served by process {first.pid}")
    await until(heartbeat.exists, "the newcomer's heartbeat written", SETTLE)
    assert await asyncio.to_thread(healthcheck, heartbeat) == 0
    assert await first.terminate() == 0
    await answers(second, port, "/readyz", 200, "is published")



async def test_under_auto_readyz_answers_for_the_api_the_node_is_served_through(
        cluster, sockdir, logdir, tmp_path):
    port = free_port()
    async with mapped_node(cluster, sockdir, logdir, tmp_path, "1.33",
                           *probe_flags(port)) as (node, serve, _):
        await answers(serve, port, "/readyz", 200, f"{RESOURCE}: registered through v1beta1")
        await node.boot("1.36")  # DRA now: the device plugin is withdrawn, slices published
        await answers(serve, port, "/readyz", 200, "the pool of node node-a is published")
        await node.boot("1.33")
        await answers(serve, port, "/readyz", 200, f"{RESOURCE}: registered through v1beta1")


__all__ = ["cluster"]  # a fixture, used by name
