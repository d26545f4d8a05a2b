"""``GET /livez``, ``/healthz`` and ``/readyz`` over HTTP, answered by the running process.

An exec probe starts a Python interpreter each time (0.14 s of CPU, 37 MiB); an ``httpGet``
probe costs the running process one short request. The server is the standard library's,
on a thread of its own rather than on the event loop:

* ``/livez`` must say 503 when the event loop is wedged, which a server on that loop could
  not (the kubelet would see a timeout with no reason). The thread reads what the loop last
  recorded (:class:`~plugin.process.liveness.Heartbeat`), never waiting for the loop;
* ``/readyz`` reads the serving state where it is written, on the event loop (one callback,
  a few attribute reads), and gives up after ``READY_WAIT``: a loop that does not answer
  within it is not ready either;
* nothing else: no new dependency, no TLS (the probe port is the kubelet's, like the
  metrics port is Prometheus's). Each request gets a short-lived thread, so a slow or silent
  client cannot delay the kubelet's probe, and a connection idle for ``CLIENT_TIMEOUT`` is
  dropped.

The port is bound before the daemon starts (:func:`bind`), so a port already taken ends the
start with one line and exit 2 rather than a pod that runs but can never pass its probes. The
accepting thread blocks until a connection comes (no polling: an idle plugin is not woken by
its probe server); closing wakes it by shutting the listening socket down.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from plugin.process.liveness import Verdict

log = logging.getLogger(__name__)

READY_WAIT = 2.0
"""Seconds /readyz waits for the event loop to read the serving state."""
CLIENT_TIMEOUT = 5.0
"""Seconds a probe connection may stay silent before it is dropped."""
THREAD_NAME = "probe server"

Question = Callable[[], Verdict]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    timeout = None  # handle_request blocks until a connection (or the close) comes
    live: Question
    ready: Question


class _IPv6Server(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = CLIENT_TIMEOUT
    server_version = "accelerator-device-plugin"
    sys_version = ""

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path in ("/livez", "/healthz"):
            self._answer(_asked(self.server.live, "liveness"))
        elif path == "/readyz":
            self._answer(_asked(self.server.ready, "readiness"))
        else:
            self._send(404, "not found: /livez, /healthz (its alias) and /readyz are served\n")

    def _answer(self, verdict: Verdict) -> None:
        self._send(200 if verdict.ok else 503, f"{'ok' if verdict.ok else 'failing'}: "
                                               f"{verdict.why}\n")

    def _send(self, status: int, text: str) -> None:
        body = text.encode("utf-8", "replace")
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Every probe would be a line on stderr (and not JSON): say nothing."""


def _asked(question: Question, what: str) -> Verdict:
    """The question's answer; a failure to answer is a 503 that says so, never a crash."""
    try:
        return question()
    except Exception as exc:  # the probe must answer whatever went wrong
        log.exception("%s probe could not be answered", what)
        return Verdict(False, f"{what} could not be evaluated: {type(exc).__name__}: {exc}")


class ProbeServer:
    """The bound probe port; :meth:`start` answers on it, :meth:`close` ends it."""

    def __init__(self, address: str, port: int) -> None:
        server_class = _IPv6Server if ":" in address else _Server
        self._server = server_class((address, port), _Handler)
        self._server.live = self._server.ready = _not_started
        self.address = address
        self._closing = False
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self, live: Question, ready: Question) -> None:
        self._server.live, self._server.ready = live, ready
        self._thread = threading.Thread(target=self._accept, name=THREAD_NAME, daemon=True)
        self._thread.start()
        log.info("probes on http://%s:%d/livez and /readyz", self.address or "0.0.0.0",
                 self.port)

    def _accept(self) -> None:
        # Named for the OS too (Python 3.11 does not), so ``top -H`` and per-thread CPU
        # accounting tell the probe thread from the others.
        with contextlib.suppress(OSError):
            Path("/proc/thread-self/comm").write_text(THREAD_NAME)
        while not self._closing:
            self._server.handle_request()

    def close(self) -> None:
        self._closing = True
        with contextlib.suppress(OSError):
            self._server.socket.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server.server_close()


def bind(address: str, port: int) -> ProbeServer:
    """The probe port, bound and listening; raises OSError when it cannot be."""
    try:
        return ProbeServer(address, port)
    except socket.gaierror as exc:  # an address that names nothing: say it as OSError
        raise OSError(exc.errno, f"{address!r} is not an address of this host "
                                 f"({exc.strerror})") from None


def _not_started() -> Verdict:
    return Verdict(False, "starting")


def on_loop(loop: asyncio.AbstractEventLoop, question: Question,
            wait: float = READY_WAIT) -> Question:
    """``question`` asked on ``loop`` from another thread, with an answer within ``wait``."""

    def ask() -> Verdict:
        answer: concurrent.futures.Future[Verdict] = concurrent.futures.Future()

        def run() -> None:
            if not answer.set_running_or_notify_cancel():
                return  # the asker gave up already
            try:
                answer.set_result(question())
            except BaseException as exc:
                answer.set_exception(exc)

        try:
            loop.call_soon_threadsafe(run)
        except RuntimeError:  # the loop is closed: the process is on its way out
            return Verdict(False, "stopping")
        try:
            return answer.result(timeout=wait)
        except concurrent.futures.TimeoutError:
            answer.cancel()
            return Verdict(False, f"the event loop did not answer within {wait:g} s")

    return ask
