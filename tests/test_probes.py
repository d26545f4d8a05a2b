"""The probe server's parts: liveness from the last self-check round, readiness by API,
answers on a thread of their own, and the flags that refuse a probe port that cannot work.

The real ``serve`` process behind them is in ``compat_tests/test_probes.py``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import socket
import threading
import urllib.error
import urllib.request
from types import SimpleNamespace
from typing import Any

import pytest

from plugin.cli import config
from plugin.process.dra_side import NodeApi
from plugin.process.liveness import Heartbeat, Verdict
from plugin.process.probe_server import THREAD_NAME, ProbeServer, bind, on_loop
from plugin.process.readiness import dra_readiness, node_readiness

DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with DIRECT.open(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# -- liveness -------------------------------------------------------------------------------


def test_liveness_is_the_last_round_and_its_age() -> None:
    clock = Clock()
    beat = Heartbeat(max_age=30, clock=clock)
    assert beat.verdict().ok, "start-up counts as a passed round"
    clock.now += 31
    stale = beat.verdict()
    assert not stale.ok and "no self-check for 31 s (limit 30 s)" in stale.why
    beat.record([])
    assert beat.verdict() == Verdict(True, "self-check passed 0.0 s ago")
    clock.now += 5
    beat.record(["b-com.com/accelerator", "DRA driver d"])
    failed = beat.verdict()
    assert not failed.ok
    assert "b-com.com/accelerator, DRA driver d did not answer" in failed.why
    beat.record([])
    assert beat.verdict().ok, "one passed round is enough to be live again"


# -- readiness ------------------------------------------------------------------------------


def ready(why: str = "registered through v1beta1") -> Any:
    return lambda: (True, why)


def not_ready(why: str = "not registered with the kubelet") -> Any:
    return lambda: (False, why)


def test_device_plugin_readiness_needs_every_resource_of_the_last_scan() -> None:
    assert not node_readiness(None, {}, None).ok, "no scan yet"
    assert node_readiness(frozenset(), {}, None).ok, "no devices: nothing to wait for"
    both = frozenset({"a.com/x", "a.com/y"})
    verdict = node_readiness(both, {"a.com/x": ready()}, None)
    assert verdict == Verdict(False, "a.com/y: not served yet")
    verdict = node_readiness(both, {"a.com/x": ready(), "a.com/y": not_ready()}, None)
    assert verdict == Verdict(False, "a.com/y: not registered with the kubelet")
    verdict = node_readiness(both, {"a.com/x": ready(), "a.com/y": ready()}, None)
    assert verdict.ok and verdict.why.count("registered through v1beta1") == 2


def driver(*, service: Any = "serving", in_sync: bool | None = True) -> Any:
    publisher = SimpleNamespace(in_sync=in_sync, problem="403 Forbidden", generation=3)
    if service == "serving":
        service = SimpleNamespace(waiting_for=None, serving=True, socket_path="/r/d.sock")
    return SimpleNamespace(place=SimpleNamespace(driver="d", node="n"), service=service,
                           publisher=publisher)


def test_auto_answers_for_the_api_the_node_is_served_through_now() -> None:
    names = frozenset({"a.com/x"})
    servers = {"a.com/x": not_ready()}
    side = SimpleNamespace(choice=None, driver=driver())
    assert "choosing between DRA and the device plugin" in \
        node_readiness(names, servers, side).why  # type: ignore[arg-type]
    side.choice = NodeApi.DRA
    assert node_readiness(names, servers, side).ok  # type: ignore[arg-type]
    side.choice = NodeApi.DEVICE_PLUGIN
    assert not node_readiness(names, servers, side).ok  # type: ignore[arg-type]


def test_dra_readiness_is_the_pool_published() -> None:
    assert not dra_readiness(None).ok
    assert dra_readiness(driver()).why == "the pool of node n is published (generation 3, " \
        "driver d)"
    assert dra_readiness(driver(in_sync=None)).why == "the pool of node n is not published yet"
    failing = dra_readiness(driver(in_sync=False))
    assert not failing.ok and "403 Forbidden" in failing.why
    waiting = SimpleNamespace(waiting_for="/r/d.sock is served by process 7", serving=False)
    verdict = dra_readiness(driver(service=waiting, in_sync=None))
    assert verdict.ok and "process 7" in verdict.why
    idle = SimpleNamespace(waiting_for=None, serving=False, socket_path="/r/d.sock")
    assert not dra_readiness(driver(service=idle)).ok
    assert not dra_readiness(driver(service=None)).ok


# -- the server -----------------------------------------------------------------------------


@pytest.fixture
def server() -> Any:
    probes = bind("127.0.0.1", 0)
    yield probes
    probes.close()


def test_answers_200_or_503_with_a_reason_and_404_elsewhere(server: ProbeServer) -> None:
    def broken() -> Verdict:
        raise KeyError("oops")

    server.start(lambda: Verdict(True, "fine"), broken)
    assert get(server.port, "/livez") == (200, "ok: fine\n")
    assert get(server.port, "/healthz?verbose") == (200, "ok: fine\n")
    status, body = get(server.port, "/readyz")
    assert status == 503 and body == "failing: readiness could not be evaluated: KeyError: 'oops'\n"
    assert get(server.port, "/metrics")[0] == 404


def test_close_ends_the_accepting_thread_and_frees_the_port() -> None:
    probes = bind("127.0.0.1", 0)
    port = probes.port
    probes.start(lambda: Verdict(True, "fine"), lambda: Verdict(True, "fine"))
    assert get(port, "/livez")[0] == 200
    assert [t for t in threading.enumerate() if t.name == THREAD_NAME]
    probes.close()
    assert not [t for t in threading.enumerate() if t.name == THREAD_NAME], \
        "the accepting thread blocks; close must wake it"
    bind("127.0.0.1", port).close()  # free again


def test_a_port_taken_or_an_unknown_address_raises_oserror() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError, match="in use"):
            bind("127.0.0.1", taken.getsockname()[1])
    with pytest.raises(OSError, match="not an address of this host"):
        bind("no-such-host.invalid", 0)


def test_ipv6_addresses_are_served() -> None:
    try:  # the machine's own IPv6 loopback, asked without the code under test
        with socket.socket(socket.AF_INET6) as plain:
            plain.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    probes = bind("::1", 0)
    try:
        probes.start(lambda: Verdict(True, "fine"), lambda: Verdict(True, "fine"))
        with DIRECT.open(f"http://[::1]:{probes.port}/livez", timeout=10) as reply:
            assert reply.status == 200
    finally:
        probes.close()


async def test_a_question_for_a_wedged_loop_is_answered_503_in_time() -> None:
    loop = asyncio.get_running_loop()
    ask = on_loop(loop, lambda: Verdict(True, "on the loop"), wait=0.5)
    assert await asyncio.to_thread(ask) == Verdict(True, "on the loop")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        asked = pool.submit(ask)
        # The loop is wedged until the question is answered: however late its thread
        # starts, the loop cannot answer it, and only the question's own wait ends it.
        answer = asked.result(timeout=60)
    assert answer == Verdict(False, "the event loop did not answer within 0.5 s")


# -- flags ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "words"), [
    (["--probe-port", "8080", "--metrics-port", "8080"], "both 8080"),
    (["--probe-port", "8081", "--heartbeat-interval", "40"], "at least twice"),
    (["--probe-port", "0"], "between 1 and 65535"),
])
def test_probe_flags_that_cannot_work_exit_2(args: list[str], words: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        config.parse(["serve", *args])
    assert stopped.value.code == 2
    assert words in capsys.readouterr().err


def test_probe_flags_and_their_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert config.parse(["serve"]).probe_port is None
    monkeypatch.setenv("ACCELERATOR_DP_PROBE_PORT", "8081")
    monkeypatch.setenv("ACCELERATOR_DP_HEARTBEAT_MAX_AGE", "90")
    settings = config.parse(["serve", "--probe-address", "::"])
    assert (settings.probe_port, settings.probe_address) == (8081, "::")
    assert settings.heartbeat_max_age == 90
