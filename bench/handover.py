"""A rolling update's gap, as the kubelet sees it, on kubelets with upstream's client handling.

Two real ``serve`` processes on one socket name (``maxSurge: 1``), rolled ``ROLLS`` times on an
emulated 1.26 kubelet, whose device manager keeps upstream's ``handler.go`` rules (see
:mod:`compat_tests.kubelet.clients`): a registration of the same resource replaces the client,
and an older client's stream end disconnects whichever client is registered by then. The
gap is from the kubelet seeing the old instance's ListAndWatch stream end (its devices marked
unhealthy: allocatable 0) to it hearing the new instance's list with every device healthy.
A node status published inside that gap shows 0.

The reference, measured in the same run, is the kubelet's own floor for that step: a minimal
plugin (:mod:`bench.reference_plugin`'s handlers, server already up) registering, then the
kubelet dialling back, asking for options and hearing the first list. A newcomer that
registers the instant the old stream has been handled cannot do better than that. Of what
remains above it, the old instance takes 1 to 6 ms from the kubelet's handling of its end
to removing its socket; most of the rest is the newcomer's Register round trip (a fresh
connection to ``kubelet.sock`` and the kubelet's dial-back into a server just put in place).
Starting the newcomer's server beforehand under its private name was tried and measured no
faster (21 to 23 ms), so it was left out.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import grpc

from api_versions.wire import WireApi, client_call
from bench.reference_plugin import handlers
from bench.serving import spawn_units
from bench.serving import stop as _stop
from bench.table import Row, median, ms
from compat_tests.kubelet import KubeletEmulator
from compat_tests.kubelet.clients import Moment

RESOURCE = "b-com.com/accelerator"
REFERENCE = "example.com/reference"
UNITS = 8
ROLLS = 7
MODEL = "1.26"


def _gap(timeline: list[Moment]) -> float | None:
    """From the old stream's end to the first full healthy list after it (None: never)."""
    ended = next((m.at for m in reversed(timeline) if m.healthy is None), None)
    if ended is None:
        return None
    back = next((m.at for m in timeline if m.at > ended and m.healthy == UNITS), None)
    return None if back is None else back - ended


async def _wait_for_waiting(process: subprocess.Popen[bytes]) -> None:
    """Give the newcomer time to start, find the socket held and settle into waiting."""
    await asyncio.sleep(1.5)
    if process.poll() is not None:
        raise RuntimeError("the second instance exited")


async def _rolls(directory: Path) -> tuple[list[float], list[float], int]:
    gaps, signalled = [], []
    async with KubeletEmulator(directory, MODEL) as kubelet:
        old = spawn_units(directory, UNITS)
        await kubelet.wait_for_devices(RESOURCE, timeout=30)
        for _ in range(ROLLS):
            new = spawn_units(directory, UNITS)
            await _wait_for_waiting(new)
            kubelet.clients.timeline.clear()
            registered = len(kubelet.registrations)
            sent = time.perf_counter()
            old.send_signal(signal.SIGTERM)
            await kubelet.wait_until(lambda n=registered: len(kubelet.registrations) > n,
                                     timeout=30, what="the newcomer's registration")
            await kubelet.wait_for_devices(RESOURCE, timeout=30)
            back = time.perf_counter()
            await asyncio.to_thread(old.wait, 10)
            gap = _gap(kubelet.clients.timeline)
            if gap is None:
                raise RuntimeError("the kubelet never saw the old stream end")
            gaps.append(gap)
            signalled.append(back - sent)
            old = new
        dropped = len(kubelet.clients.dropped_by_older)
        _stop(old)
    return gaps, signalled, dropped


async def _reference_server(wire: WireApi, socket: Path) -> grpc.aio.Server:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        wire.service("DevicePlugin").full_name,
        {path.rsplit("/", 1)[1]: h for path, h in handlers(wire, UNITS).items()})])
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    return server


async def _reference(directory: Path) -> list[float]:
    """Register a ready minimal plugin ``ROLLS`` times; each: Register to its list heard."""
    figures = []
    wire = WireApi.load("v1beta1")
    async with KubeletEmulator(directory, MODEL) as kubelet:
        server = await _reference_server(wire, directory / "reference.sock")
        async with grpc.aio.insecure_channel(f"unix://{kubelet.socket_path}") as channel:
            register = client_call(channel, wire.method("Registration", "Register"))
            for _ in range(ROLLS):
                kubelet.clients.timeline.clear()
                began = time.perf_counter()
                await register(wire.new("RegisterRequest", version="v1beta1",
                                        endpoint="reference.sock", resource_name=REFERENCE),
                               timeout=10)
                await kubelet.wait_until(lambda: any(
                    m.healthy == UNITS for m in kubelet.clients.timeline), 10, "the list")
                heard = next(m.at for m in kubelet.clients.timeline if m.healthy == UNITS)
                figures.append(heard - began)
                await server.stop(0)  # end the stream, as the old instance does
                await kubelet.wait_until(lambda: not kubelet.is_connected(REFERENCE), 10,
                                         "the stream's end")
                server = await _reference_server(wire, directory / "reference.sock")
        await server.stop(0)
    return figures


def run() -> list[Row]:
    directory = Path(tempfile.mkdtemp(prefix="dpho", dir="/tmp"))
    try:
        reference = asyncio.run(_reference(directory))
        gaps, signalled, dropped = asyncio.run(_rolls(directory))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    ratio = median(gaps) / median(reference)
    return [
        Row("roll: old stream end to new devices held", ms(median(gaps)), "floor",
            f"median of {ROLLS} rolls of two serve processes, emulated {MODEL} kubelet with "
            f"upstream's client handling; max {ms(max(gaps))}"),
        Row("roll: reference registration to devices held", ms(median(reference)), "",
            f"median of {ROLLS}: a ready minimal plugin's Register to its list heard"),
        Row("roll: gap / reference (p50)", f"{ratio:.2f}x", "",
            f"SIGTERM to devices held: {ms(median(signalled))}; new client dropped by the "
            f"old stream's end: {dropped} time(s)"),
    ]


if __name__ == "__main__":
    from bench.table import render

    print(render(run()))
