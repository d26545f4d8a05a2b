"""Loads waiting for their card in the loader process: one at a time per card, within the
client's budget, and only while the client still waits.

A fake loader stands in for the card (it records when each load runs), behind the real
:class:`LoaderService` and, for hang-ups, its real unix socket: two loads onto two ports of
one FME never run at once while loads onto two cards do; a load whose budget went on the
wait is refused untouched, saying so, and one that starts gets what is left; a load whose
client closed its socket while it waited is dropped, while a client that only half-closed
(as the driver's does once its request is sent) is still served.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from compat_tests.fake_sysfs import FakeNode, build_intel_node
from plugin.discovery.backends import make_backend
from plugin.programming.digest import DIGEST_STEP
from plugin.programming.library import ImageLibrary
from plugin.programming.loaders.base import LoadJob
from plugin.programming.remote import server
from plugin.programming.remote.server import CARD_STEP, LoaderService, serve_socket
from value_types.devices import Device

PORT0, PORT1 = "0000:3b:00.0", "0000:3b:00.0-port1"
"""Two ports of one card (one FME node)."""
OTHER = "0000:d8:00.0"
"""A port of another card."""
NLB3 = "f7df405cbd7acf7222f144b0b93acd18"


class FakeLoader:
    """Each load takes ``hold`` seconds (or until ``gate`` opens) and is recorded."""

    name = "fake"
    family = "intel"

    def __init__(self, hold: float = 0.3) -> None:
        self.hold = hold
        self.gate: threading.Event | None = None
        self.running: set[str] = set()
        self.overlaps: list[tuple[str, ...]] = []
        self.jobs: list[LoadJob] = []
        self.started = threading.Event()
        self._guard = threading.Lock()

    def unavailable(self, device: Device) -> str | None:
        return None

    def load_blocking(self, job: LoadJob) -> None:
        with self._guard:
            self.jobs.append(job)
            if self.running:
                self.overlaps.append(tuple(sorted({*self.running, job.device.id})))
            self.running.add(job.device.id)
        self.started.set()
        try:
            if self.gate is not None:
                assert self.gate.wait(30)
            else:
                time.sleep(self.hold)
        finally:
            with self._guard:
                self.running.discard(job.device.id)

    def loaded_blocking(self, device: Device) -> str | None:
        return None

    async def load(self, job: LoadJob) -> None:
        raise AssertionError("the loader process calls load_blocking")

    async def loaded(self, device: Device) -> str | None:
        raise AssertionError("the loader process calls loaded_blocking")


def in_threads(*calls: object) -> list[object]:
    """Each of ``calls`` (a zero-argument callable) in a thread of its own, as the loader
    serves connections; their results in order."""
    results: list[object] = [None] * len(calls)

    def run(i: int) -> None:
        results[i] = calls[i]()  # type: ignore[operator]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


class Background:
    """``call()`` in a thread; :meth:`result` waits for it."""

    def __init__(self, call: object) -> None:
        self._result: list[object] = []
        self._thread = threading.Thread(target=lambda: self._result.append(call()))  # type: ignore[operator]
        self._thread.start()

    def result(self) -> object:
        self._thread.join(60)
        assert self._result, "the call did not end"
        return self._result[0]


def request(device: str, timeout: float = 20, **fields: object) -> bytes:
    body = {"v": 1, "op": "load", "device": device, "function_id": NLB3, "image": None,
            "sha256": None, "timeout": timeout, **fields}
    return json.dumps(body).encode() + b"\n"


@pytest.fixture
def node(tmp_path: Path) -> FakeNode:
    return build_intel_node(tmp_path / "node")


@pytest.fixture
def fake() -> FakeLoader:
    return FakeLoader()


@pytest.fixture
def service(node: FakeNode, fake: FakeLoader, tmp_path: Path) -> LoaderService:
    backend = make_backend("intel", node.config())
    library = tmp_path / "images"
    library.mkdir()
    (library / "nlb3.gbs").write_bytes(b"not read by the fake loader")
    return LoaderService(lambda: list(backend.scan()), {"intel": fake}, ImageLibrary(library))


def answered(data: bytes) -> dict[str, object]:
    return json.loads(data)


def test_two_ports_of_one_card_are_never_loaded_at_once(service, fake):
    answers = in_threads(lambda: service.answer(request(PORT0)),
                         lambda: service.answer(request(PORT1)))
    assert [answered(a)["ok"] for a in answers] == [True, True]
    assert sorted(j.device.id for j in fake.jobs) == [PORT0, PORT1]
    assert fake.overlaps == []


def test_two_cards_are_loaded_at_once(service, fake):
    """What the test above relies on: the fake loader does see loads that overlap."""
    in_threads(lambda: service.answer(request(PORT0)), lambda: service.answer(request(OTHER)))
    assert fake.overlaps == [(PORT0, OTHER)]


def test_a_load_whose_budget_went_on_the_wait_is_refused_untouched(service, fake):
    fake.gate = threading.Event()
    first = Background(lambda: service.answer(request(PORT0)))
    assert fake.started.wait(30)
    second = answered(service.answer(request(PORT1, timeout=1.0)))
    fake.gate.set()
    assert answered(first.result())["ok"] is True
    assert second["ok"] is False and second["touched"] is False
    assert second["step"] == CARD_STEP
    assert re.search(r"waited [0-9.]+ s for card /dev/dfl-fme.0 \(another load onto it",
                     str(second["detail"]))
    assert "of the load's 1 s timeout are left; nothing was loaded" in str(second["detail"])
    assert [j.device.id for j in fake.jobs] == [PORT0]


def test_a_load_that_waited_starts_with_what_is_left_of_its_budget(service, fake):
    fake.gate = threading.Event()
    first = Background(lambda: service.answer(request(PORT0)))
    assert fake.started.wait(30)
    second = Background(lambda: service.answer(request(PORT1, timeout=20)))
    time.sleep(0.5)  # the second load waits at least this long for the card
    fake.gate.set()
    assert answered(second.result())["ok"] is True and answered(first.result())["ok"] is True
    waited_job = fake.jobs[1]
    assert waited_job.device.id == PORT1
    assert 0 < waited_job.timeout <= 19.5  # the wait came off its 20 s


def test_the_require_digest_setting_refuses_an_unpinned_image_untouched(node, fake,
                                                                       tmp_path):
    backend = make_backend("intel", node.config())
    library = tmp_path / "lib"
    library.mkdir()
    (library / "nlb3.gbs").write_bytes(b"x")
    strict = LoaderService(lambda: list(backend.scan()), {"intel": fake},
                           ImageLibrary(library), require_digest=True)
    refused = answered(strict.answer(request(PORT0, image="nlb3.gbs")))
    assert refused["ok"] is False and refused["touched"] is False
    assert refused["step"] == DIGEST_STEP
    assert "'nlb3.gbs' is not pinned by sha256" in str(refused["detail"])
    assert "--require-image-digest" in str(refused["detail"])
    pinned = answered(strict.answer(request(PORT0, image="nlb3.gbs", sha256="a" * 64)))
    by_id = answered(strict.answer(request(PORT0)))  # no image: a load by ID
    assert pinned["ok"] is True and by_id["ok"] is True
    assert [j.image for j in fake.jobs] == ["nlb3.gbs", None]


# Over the socket: a client that hangs up ------------------------------------------------------

@pytest.fixture
def served(tmp_path: Path, service: LoaderService) -> Iterator[Path]:
    path = tmp_path / "run" / "loader.sock"
    stop = threading.Event()
    thread = threading.Thread(target=serve_socket, args=(path, [os.geteuid()], service, stop))
    thread.start()
    while not path.exists():
        time.sleep(0.02)
    yield path
    stop.set()
    thread.join(60)
    assert not thread.is_alive()


def connected(path: Path, data: bytes) -> socket.socket:
    """A client that sent ``data`` and half-closed, as the driver's does."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(path))
    sock.sendall(data)
    sock.shutdown(socket.SHUT_WR)
    return sock


def answer_on(sock: socket.socket) -> dict[str, object]:
    with sock:
        sock.settimeout(20)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return json.loads(data)


def test_a_queued_load_whose_client_hung_up_is_dropped(served, fake, monkeypatch, caplog):
    monkeypatch.setattr(server, "HANGUP_POLL", 0.02)
    fake.gate = threading.Event()
    first = connected(served, request(PORT0))
    assert fake.started.wait(30)
    queued = connected(served, request(PORT1))
    waiting = connected(served, request(PORT1))  # half-closed only: still waiting
    time.sleep(0.2)
    queued.close()
    time.sleep(0.2)
    fake.gate.set()
    assert answer_on(first)["ok"] is True
    assert answer_on(waiting)["ok"] is True
    assert [j.device.id for j in fake.jobs] == [PORT0, PORT1]  # the hung-up one never ran
    assert any("the client hung up while the load waited" in r.getMessage()
               for r in caplog.records)


def test_a_started_load_is_not_cut_off_when_its_client_hangs_up(served, fake):
    fake.gate = threading.Event()
    first = connected(served, request(PORT0))
    assert fake.started.wait(30)
    first.close()
    time.sleep(0.2)
    assert fake.running == {PORT0}
    fake.gate.set()
    following = answer_on(connected(served, request(PORT1)))
    assert following["ok"] is True
    assert [j.device.id for j in fake.jobs] == [PORT0, PORT1]


def test_a_half_closed_client_is_not_a_hang_up_and_a_closed_one_is():
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours:
        theirs.sendall(b"{}")
        theirs.shutdown(socket.SHUT_WR)
        assert not server.hung_up(ours)
        theirs.close()
        assert server.hung_up(ours)
