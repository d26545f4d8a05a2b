"""The loader process's request, server and client, over real unix sockets on a fake node.

The server is the privileged half, so everything it is sent is hostile until checked:
a malformed or oversized request, a path leaving the library, a device this node does not
have, a digest the bytes do not have, a peer with another UID. Each is refused with a
clear answer, nothing reaches the card, and the server goes on answering. The client side
turns a missing, refusing or hung loader into a bounded LoadFailed saying whether the card
may have been touched.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from compat_tests.fake_fpga_tools import write_stand_in_tools
from compat_tests.fake_port_pr import FakePortPr
from compat_tests.fake_sysfs import DEFAULT_INTERFACE_ID, FakeNode, build_intel_node
from compat_tests.fpga_images import NLB3_AFU_ID, build_gbs, write_image
from plugin.discovery.backends import make_backend
from plugin.programming.digest import DIGEST_STEP
from plugin.programming.ids import dashed
from plugin.programming.library import ImageLibrary
from plugin.programming.loaders.base import LoadFailed, LoadJob
from plugin.programming.loaders.card_locked import CardLockedLoader
from plugin.programming.loaders.fpgaconf import Fpgaconf
from plugin.programming.loaders.intel_pr import PortPrIoctl
from plugin.programming.remote import client as client_module
from plugin.programming.remote import protocol, server
from plugin.programming.remote.client import LoaderClient, RemoteLoader
from plugin.programming.remote.protocol import BadRequest, Request, parse_request
from plugin.programming.remote.server import LoaderService, serve_socket

NLB3 = NLB3_AFU_ID.replace("-", "")
PORT = "0000:d8:00.0"


def load_request(**fields: object) -> bytes:
    body = {"v": 1, "op": "load", "device": PORT, "function_id": NLB3, "image": "nlb3.gbs",
            "sha256": None, "timeout": 20}
    body.update(fields)
    return json.dumps({k: v for k, v in body.items() if v is not ...}).encode()


# The request ----------------------------------------------------------------------------------

def test_a_load_request_round_trips():
    sent = Request("load", device=PORT, function_id=NLB3, image="a/b.gbs", sha256="a" * 64,
                   timeout=12.5)
    assert parse_request(sent.encode()) == sent
    assert parse_request(Request("inventory").encode()) == Request("inventory")


@pytest.mark.parametrize(("data", "words"), [
    (b"not json", "not a JSON object"),
    (b"[1, 2]", "not a JSON object"),
    (b"\xff\xfe", "not a JSON object"),
    (json.dumps({"v": 2, "op": "inventory"}).encode(), "version 2"),
    (json.dumps({"v": 1, "op": "flash"}).encode(), "op 'flash'"),
    (json.dumps({"v": 1, "op": "inventory", "path": "/etc"}).encode(), "unknown field(s) 'path'"),
    (load_request(sha256=...), "field sha256 is missing"),
    (load_request(timeout="20"), "field timeout has the wrong type"),
    (load_request(timeout=True), "field timeout has the wrong type"),
    (load_request(timeout=1e9), "timeout must be between"),
    (load_request(timeout=float("nan")), "not a JSON object"),
    (load_request(device="../../x"), "is not a device ID"),
    (load_request(function_id="x; reboot"), "is not a function ID"),
    (load_request(sha256="abc"), "not a SHA-256 digest"),
    (load_request(sha256="A" * 64), "lower-case"),
    (load_request(image=""), "1 to 4096 characters"),
    (b"{" + b" " * protocol.MAX_REQUEST + b"}", "over 8192 bytes"),
])
def test_a_bad_request_is_refused_naming_what_is_wrong(data, words):
    with pytest.raises(BadRequest, match=None) as caught:
        parse_request(data)
    assert words in str(caught.value)


# The service, on a fake node -----------------------------------------------------------------

@pytest.fixture
def node(tmp_path: Path) -> FakeNode:
    return build_intel_node(tmp_path / "node")


@pytest.fixture
def library(tmp_path: Path) -> ImageLibrary:
    root = tmp_path / "images"
    write_image(root, "nlb3.gbs", build_gbs(interface_id=dashed(DEFAULT_INTERFACE_ID),
                                            afu_ids=[NLB3_AFU_ID], bitstream=b"\x5a" * 4096))
    (tmp_path / "outside.gbs").write_bytes((root / "nlb3.gbs").read_bytes())
    (root / "escape.gbs").symlink_to(tmp_path / "outside.gbs")
    return ImageLibrary(root)


@pytest.fixture
def port_pr(node: FakeNode, library: ImageLibrary) -> FakePortPr:
    return FakePortPr(node, [(library.root / "nlb3.gbs").read_bytes()])


@pytest.fixture
def service(node: FakeNode, library: ImageLibrary, port_pr: FakePortPr) -> LoaderService:
    backend = make_backend("intel", node.config())
    return LoaderService(lambda: list(backend.scan()),
                         {"intel": PortPrIoctl(node.dev_root, ioctl=port_pr)}, library)


def afu(node: FakeNode, device_id: str = PORT) -> str:
    devices = {d.id: d for d in make_backend("intel", node.config()).scan()}
    return devices[device_id].attrs["afu_id"]


def answer_of(data: bytes) -> dict[str, object]:
    return json.loads(data)


def test_the_service_loads_a_library_image_onto_its_own_device(service, node, port_pr):
    answer = answer_of(service.answer(load_request()))
    assert answer == {"ok": True, "loader": "ioctl"}
    assert len(port_pr.calls) == 1 and afu(node) == NLB3


@pytest.mark.parametrize(("image", "words"), [
    ("../outside.gbs", "'..' component"),
    ("/etc/passwd", "is absolute"),
    ("escape.gbs", "outside the image library"),
    ("missing.gbs", "is not in the image library"),
])
def test_the_service_refuses_a_path_outside_the_library(service, node, port_pr, image,
                                                        words):
    before = afu(node)
    answer = answer_of(service.answer(load_request(image=image)))
    assert answer["ok"] is False and answer["touched"] is False
    assert answer["step"] == "check image" and words in str(answer["detail"])
    assert port_pr.calls == [] and afu(node) == before


def test_the_service_refuses_a_device_that_is_not_on_the_node(service, port_pr):
    answer = answer_of(service.answer(load_request(device="0000:99:00.0")))
    assert answer["ok"] is False and answer["touched"] is False
    assert "0000:99:00.0 is not on this node" in str(answer["detail"])
    assert port_pr.calls == []


def test_the_service_refuses_a_digest_mismatch(service, node, port_pr, library):
    actual = hashlib.sha256((library.root / "nlb3.gbs").read_bytes()).hexdigest()
    answer = answer_of(service.answer(load_request(sha256="1" * 64)))
    assert answer["ok"] is False and answer["touched"] is False
    assert answer["step"] == DIGEST_STEP and actual in str(answer["detail"])
    assert port_pr.calls == []
    assert answer_of(service.answer(load_request(sha256=actual)))["ok"] is True
    assert afu(node) == NLB3


def test_the_service_inventory_says_what_it_can_program(service):
    answer = answer_of(service.answer(Request("inventory").encode()))
    devices = answer["devices"]
    assert isinstance(devices, dict) and devices[PORT] is None
    assert answer["loaders"] == {"intel": "ioctl"}
    assert any(reason and "virtual function" in reason for reason in devices.values())


def test_a_bad_request_is_answered_and_the_service_goes_on(service):
    answer = answer_of(service.answer(b"\x00garbage"))
    assert answer["ok"] is False and answer["step"] == protocol.REQUEST_STEP
    assert answer_of(service.answer(Request("inventory").encode()))["ok"] is True


# Over the socket ------------------------------------------------------------------------------

class Served:
    """:func:`serve_socket` in a thread, as the loader process runs it in its main one."""

    def __init__(self, path: Path, allowed: list[int], service: LoaderService) -> None:
        self.path = path
        self.stop = threading.Event()
        self.thread = threading.Thread(target=serve_socket,
                                       args=(path, allowed, service, self.stop))
        self.thread.start()
        for _ in range(500):
            if path.exists():
                break
            time.sleep(0.02)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(60)
        assert not self.thread.is_alive()


@pytest.fixture
def served(tmp_path: Path, service: LoaderService) -> Iterator[Path]:
    running = Served(tmp_path / "run" / "loader.sock", [os.geteuid()], service)
    yield running.path
    running.close()


def raw_exchange(path: Path, data: bytes, *, close_write: bool = True) -> dict[str, object]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(path))
        try:
            sock.sendall(data)
            if close_write:
                sock.shutdown(socket.SHUT_WR)
        except BrokenPipeError:
            pass  # answered and closed before reading it all: the answer is still there
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return json.loads(b"".join(chunks))


async def test_the_socket_and_its_directory_are_the_drivers_only(served):
    assert stat.S_IMODE(served.parent.stat().st_mode) == 0o700
    assert stat.S_ISSOCK(served.stat().st_mode)
    assert stat.S_IMODE(served.stat().st_mode) == 0o600


async def test_oversized_and_malformed_requests_never_end_the_server(served):
    big = await asyncio.to_thread(raw_exchange, served, b"{" + b"x" * 100_000)
    assert big["ok"] is False and "over 8192 bytes" in str(big["detail"])
    bad = await asyncio.to_thread(raw_exchange, served, b'{"v": 1, "op": "load"}')
    assert bad["ok"] is False and "field device is missing" in str(bad["detail"])
    good = await asyncio.to_thread(raw_exchange, served, Request("inventory").encode())
    assert good["ok"] is True


async def test_a_peer_that_sends_nothing_is_dropped_in_bounded_time(served, monkeypatch):
    monkeypatch.setattr(server, "READ_TIMEOUT", 0.3)
    answer = await asyncio.to_thread(raw_exchange, served, b'{"v": 1,', close_write=False)
    assert answer["ok"] is False and "no whole request within 0.3 s" in str(answer["detail"])


async def test_a_peer_with_another_uid_is_refused_unread(tmp_path, service, port_pr, node,
                                                         library):
    path = tmp_path / "other" / "loader.sock"
    running = Served(path, [os.geteuid() + 4242], service)
    answer = await asyncio.to_thread(raw_exchange, path, load_request())
    with pytest.raises(LoadFailed) as caught:  # the driver's client reads the refusal too
        await RemoteLoader(LoaderClient(path), "intel").load(job(node, library))
    assert not caught.value.touched and "may not use the loader" in caught.value.detail
    running.close()
    assert answer["ok"] is False and f"peer UID {os.geteuid()} may not use" in \
        str(answer["detail"])
    assert port_pr.calls == []


def test_a_file_that_is_not_a_socket_is_never_replaced(tmp_path, service):
    path = tmp_path / "run" / "loader.sock"
    path.parent.mkdir()
    path.write_text("keep me")
    with pytest.raises(OSError, match="not a socket"):
        serve_socket(path, [0], service, threading.Event())
    assert path.read_text() == "keep me"


# The driver's side ---------------------------------------------------------------------------

def job(node: FakeNode, library: ImageLibrary, **kwargs: object) -> LoadJob:
    device = {d.id: d for d in make_backend("intel", node.config()).scan()}[PORT]
    values: dict[str, object] = dict(device=device, function_id=NLB3, library=library,
                                     image="nlb3.gbs", timeout=5.0)
    values.update(kwargs)
    return LoadJob(**values)  # type: ignore[arg-type]


async def test_a_remote_loader_loads_through_the_loader_process(served, node, library,
                                                                port_pr):
    client = LoaderClient(served)
    await asyncio.to_thread(client.refresh)
    loader = RemoteLoader(client, "intel")
    assert loader.name == "ioctl"
    assert loader.unavailable(job(node, library).device) is None
    await loader.load(job(node, library))
    assert len(port_pr.calls) == 1 and afu(node) == NLB3


async def test_a_refusal_comes_back_as_the_loaders_own_failure(served, node, library,
                                                               port_pr):
    client = LoaderClient(served)
    with pytest.raises(LoadFailed) as caught:
        await RemoteLoader(client, "intel").load(job(node, library, sha256="2" * 64))
    assert caught.value.step == DIGEST_STEP and not caught.value.touched
    assert port_pr.calls == []


async def test_a_missing_socket_is_a_bounded_untouched_failure(tmp_path, node, library):
    client = LoaderClient(tmp_path / "nowhere.sock")
    with pytest.raises(LoadFailed) as caught:
        await RemoteLoader(client, "intel").load(job(node, library))
    assert caught.value.step == client_module.REACH_STEP and not caught.value.touched
    assert "nothing was sent" in caught.value.detail
    client.refresh()
    assert "cannot be reached" in (client.unavailable(job(node, library).device) or "")


async def test_a_refusing_socket_is_a_bounded_untouched_failure(tmp_path, node, library):
    path = tmp_path / "dead.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(str(path))  # bound, never listening: connect(2) gets ECONNREFUSED
        with pytest.raises(LoadFailed) as caught:
            await RemoteLoader(LoaderClient(path), "intel").load(job(node, library))
    assert not caught.value.touched and "refused" in caught.value.detail.lower()


async def test_a_hung_loader_is_a_bounded_failure_with_the_card_state_unknown(
        tmp_path, node, library, monkeypatch):
    monkeypatch.setattr(client_module, "ANSWER_GRACE", 0.2)
    path = tmp_path / "hung.sock"

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(3600)

    hung = await asyncio.start_unix_server(never_answer, path=str(path))
    with pytest.raises(LoadFailed) as caught:
        await RemoteLoader(LoaderClient(path), "intel").load(job(node, library, timeout=0.5))
    assert caught.value.touched and "unknown" in caught.value.detail
    assert "gave no answer within 0.7 s" in caught.value.detail, "the load's 0.5 s + the grace"
    hung.close()


def test_tool_loaders_are_served_too(tmp_path, node, library):
    """The loader process runs whichever loader its flags choose (fpgaconf here)."""
    tools = write_stand_in_tools(tmp_path / "tools", node)
    backend = make_backend("intel", node.config())
    service = LoaderService(lambda: list(backend.scan()),
                            {"intel": Fpgaconf(tools.fpgaconf)}, library)
    answer = json.loads(service.answer(load_request()))
    assert answer == {"ok": True, "loader": "fpgaconf"} and afu(node) == NLB3


# The command line ------------------------------------------------------------------------------

def test_the_loader_command_needs_its_socket(capsys):
    from plugin.cli import config

    with pytest.raises(SystemExit) as exited:
        config.parse(["loader"])
    assert exited.value.code == 2
    assert "needs --loader-socket" in capsys.readouterr().err
    settings = config.parse(["loader", "--loader-socket", "/run/l/l.sock",
                             "--loader-allowed-uids", "0,1000", "--loader-network", "keep"])
    assert settings.loader_allowed_uids == (0, 1000) and settings.loader_network == "keep"
    with pytest.raises(SystemExit):
        config.parse(["loader", "--loader-socket", "/x", "--loader-allowed-uids", "root"])


def test_serve_loads_in_process_unless_given_the_loader_socket(tmp_path, monkeypatch, node):
    from plugin.cli import config
    from plugin.programming.setup import loaders_for

    base = ["serve", "--programming", "on", "--dra-state-dir", str(tmp_path / "state")]
    local = loaders_for(config.parse(base))["intel"]
    # Loaded in this process, each load under its card's lock in the driver's state dir.
    assert isinstance(local, CardLockedLoader) and isinstance(local.inner, PortPrIoctl)
    assert local.files.directory == tmp_path / "state" / "cards"
    missing = tmp_path / "none.sock"
    monkeypatch.setenv("ACCELERATOR_DP_LOADER_SOCKET", str(missing))
    remote = loaders_for(config.parse(base))
    assert sorted(remote) == ["alveo", "aws", "intel"]
    assert all(isinstance(loader, RemoteLoader) for loader in remote.values())
    port = {d.id: d for d in make_backend("intel", node.config()).scan()}[PORT]
    assert f"the loader process at {missing} cannot be reached" in (
        remote["intel"].unavailable(port) or "")
    remote["intel"].client.stop()  # type: ignore[attr-defined]
