"""The real ``loader`` process at its edges: what it is sent, who waits, what it holds.

``python -m plugin loader`` on a fake Intel node with the stand-in ``fpgaconf`` (made slow
where loads must overlap), spoken to over its socket as the driver would, or as a broken or
compromised driver could:

* malformed requests (deep nesting, an ID with a trailing newline) are refusals, and the
  process goes on answering;
* a load queued behind another on one card is dropped when its client hangs up, and one
  whose budget went on the wait is refused untouched: the tool runs for neither;
* ``loader --require-image-digest`` refuses an unpinned image on its own;
* the process imports no gRPC, HTTP or Kubernetes client, none of the serving code, and no
  asyncio.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from compat_tests.fake_fpga_tools import StandInTools, write_stand_in_tools
from compat_tests.fake_sysfs import DEFAULT_INTERFACE_ID, build_intel_node
from compat_tests.fpga_images import NLB3_AFU_ID, build_gbs, write_image
from plugin.programming.ids import dashed

NLB3 = NLB3_AFU_ID.replace("-", "")
PORT0 = "0000:3b:00.0"
FORBIDDEN = ("grpc", "google", "aiohttp", "lightkube", "httpx", "kubernetes",
             "prometheus_client", "api_versions", "plugin.serving", "plugin.process.daemon",
             "plugin.process.metrics", "plugin.programming.programmer", "yaml", "asyncio",
             "ssl", "hashlib", "_hashlib", "secrets", "shutil", "lzma", "bz2")
"""Modules (and their submodules) the privileged process must never hold: the RPC and API
clients, metrics, the serving code and the driver's programmer; asyncio (and the ssl it
imports), a third of its memory, since it serves with threads; OpenSSL's hashing (hashlib,
and secrets through hmac), which maps libcrypto for one hash the interpreter has built in
(:mod:`plugin.model.sha256`); shutil, which maps zlib, bz2 and lzma (argparse asks it for the
terminal's width: :mod:`plugin.cli.help_formatter`); yaml only comes with --config, which
these runs do not give."""


class Loader:
    """A running ``loader``; its log in ``log``, its modules (at exit) in ``modules``."""

    def __init__(self, root: Path, *flags: str, delay: float = 0.0) -> None:
        self.node = build_intel_node(root / "node")
        self.library = root / "images"
        image = build_gbs(afu_ids=(NLB3_AFU_ID,), interface_id=dashed(DEFAULT_INTERFACE_ID))
        write_image(self.library, "nlb3.gbs", image)
        self.tools: StandInTools = write_stand_in_tools(root / "tools", self.node, delay=delay)
        self.socket = root / "run" / "loader.sock"
        self.log = root / "loader.log"
        self.modules_file = root / "modules.json"
        args = ["loader", "--backend", "intel", "--sysfs-root", str(self.node.sysfs_root),
                "--dev-root", str(self.node.dev_root), "--image-library", str(self.library),
                "--loader-socket", str(self.socket), "--intel-loader", "fpgaconf",
                "--fpgaconf", str(self.tools.fpgaconf), "--loader-allowed-uids",
                str(os.geteuid()), "--log-format", "json", *flags]
        # The real entry point (python -m plugin), run so that the modules it holds are
        # written down as it exits.
        code = ("import atexit, json, runpy, sys\n"
                f"atexit.register(lambda: open({str(self.modules_file)!r}, 'w')"
                ".write(json.dumps(sorted(sys.modules))))\n"
                f"sys.argv = ['accelerator-device-plugin', *{args!r}]\n"
                "runpy.run_module('plugin', run_name='__main__', alter_sys=True)\n")
        with self.log.open("ab") as out:
            self.process = subprocess.Popen([sys.executable, "-c", code], stdout=out,
                                            stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not self.socket.exists():
            assert self.process.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, "the loader's socket never appeared"
            time.sleep(0.05)

    def send(self, body: bytes) -> socket.socket:
        """A client that sent ``body`` and half-closed, as the driver's does."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(30)
        sock.connect(str(self.socket))
        sock.sendall(body)
        sock.shutdown(socket.SHUT_WR)
        return sock

    def ask(self, body: bytes) -> dict[str, object]:
        return answer_on(self.send(body))

    def messages(self) -> list[str]:
        return [json.loads(line).get("message", "") for line in
                self.log.read_text().splitlines() if line.startswith("{")]

    def stop(self) -> list[str]:
        """SIGTERM, as the kubelet stops it; the modules it held."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(30)
        return json.loads(self.modules_file.read_text())


def answer_on(sock: socket.socket) -> dict[str, object]:
    with sock:
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return json.loads(data)


def load(device: str, timeout: float = 20, **fields: object) -> bytes:
    body = {"v": 1, "op": "load", "device": device, "function_id": NLB3, "image": "nlb3.gbs",
            "sha256": None, "timeout": timeout, **fields}
    return json.dumps(body).encode() + b"\n"


INVENTORY = b'{"v": 1, "op": "inventory"}\n'


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Loader]]:
    """``start(*flags, delay=...)``: a loader, killed after the test if still running."""
    started: list[Loader] = []

    def starting(*flags: str, delay: float = 0.0) -> Loader:
        started.append(Loader(tmp_path / str(len(started)), *flags, delay=delay))
        return started[-1]

    yield starting
    for running in started:
        if running.process.poll() is None:
            running.process.kill()
            running.process.wait(10)


@pytest.fixture
def loader(start: Callable[..., Loader]) -> Loader:
    return start()


def test_malformed_requests_are_refused_and_the_loader_goes_on(loader: Loader) -> None:
    deep = loader.ask(b"[" * 4000)
    assert deep["ok"] is False and "nested too deeply" in str(deep["detail"])
    for field in ("device", "function_id"):
        body = json.loads(load(PORT0))
        body[field] += "\n"
        refused = loader.ask(json.dumps(body).encode())
        assert refused["ok"] is False and field in str(refused["detail"])
    assert loader.ask(INVENTORY)["ok"] is True
    assert loader.process.poll() is None
    assert loader.tools.invocations() == []


def test_a_queued_load_whose_client_hung_up_is_dropped(start: Callable[..., Loader]) -> None:
    loader = start(delay=2.0)
    first = loader.send(load(PORT0))
    while not loader.tools.invocations("fpgaconf"):
        time.sleep(0.02)  # the first load is under way on the card
    queued = loader.send(load(PORT0))  # the same card (fpgaconf programs port 0 only)
    time.sleep(0.3)
    queued.close()
    assert answer_on(first)["ok"] is True
    assert loader.ask(INVENTORY)["ok"] is True
    assert len(loader.tools.invocations("fpgaconf")) == 1  # the hung-up load never ran
    assert any("the client hung up while the load waited" in m for m in loader.messages())


def test_a_load_whose_budget_went_on_the_wait_is_refused_untouched(
        start: Callable[..., Loader]) -> None:
    loader = start(delay=2.0)
    first = loader.send(load(PORT0))
    while not loader.tools.invocations("fpgaconf"):
        time.sleep(0.02)
    late = loader.ask(load(PORT0, timeout=1))
    assert answer_on(first)["ok"] is True
    assert late["ok"] is False and late["touched"] is False
    assert late["step"] == "wait for card"
    assert "for card /dev/dfl-fme.0 (another load onto it under way)" in str(late["detail"])
    assert len(loader.tools.invocations("fpgaconf")) == 1


def test_the_loader_refuses_an_unpinned_image_on_its_own(
        start: Callable[..., Loader]) -> None:
    loader = start("--require-image-digest")
    refused = loader.ask(load(PORT0))
    assert refused["ok"] is False and refused["touched"] is False
    assert "not pinned by sha256" in str(refused["detail"])
    assert loader.tools.invocations() == []
    digest = __import__("hashlib").sha256((loader.library / "nlb3.gbs").read_bytes())
    assert loader.ask(load(PORT0, sha256=digest.hexdigest()))["ok"] is True
    assert len(loader.tools.invocations("fpgaconf")) == 1


def test_the_loader_holds_no_client_and_no_serving_code(loader: Loader) -> None:
    assert loader.ask(INVENTORY)["ok"] is True
    assert loader.ask(load(PORT0))["ok"] is True  # a whole load, tool and all
    pinned = hashlib.sha256((loader.library / "nlb3.gbs").read_bytes()).hexdigest()
    assert loader.ask(load(PORT0, sha256=pinned))["ok"] is True  # and a pinned one
    modules = loader.stop()
    assert "plugin.programming.remote.server" in modules  # what it is there for
    held = [m for m in modules if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)]
    assert held == []


def test_sigterm_finishes_the_load_under_way(start: Callable[..., Loader]) -> None:
    """The kubelet stopping the loader mid-load: the load runs to its end and is answered,
    new connections are no longer taken, and the process exits cleanly."""
    loader = start(delay=1.5)
    first = loader.send(load(PORT0))
    while not loader.tools.invocations("fpgaconf"):
        time.sleep(0.02)  # the load is under way on the card
    loader.process.send_signal(signal.SIGTERM)
    assert answer_on(first)["ok"] is True
    assert loader.process.wait(30) == 0
    assert not loader.socket.exists()
    assert "loader: stopped" in loader.messages()
