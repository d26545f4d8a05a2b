"""Where the memory DRA adds to ``serve`` goes: the import stack, one layer at a time.

``python -m bench.dra_memory`` starts a fresh interpreter that imports what a device-plugin
``serve`` imports, then the DRA path's imports in layers (the standard-library modules httpx2
pulls in, then each third-party package, then the driver's own modules) and prints, for each
layer, the Python heap it added (``tracemalloc``: exact, and blind to native memory) and the
VmRSS it added (what the node pays, native libraries included, but moved by allocator slack
from one layer to the next). Each is measured in its own interpreter: tracing adds its own
bookkeeping to every allocation, which would swell the VmRSS figures. The ``memory DRA adds``
row of ``python -m bench dra`` is the whole of it, measured on running processes; this tool
says which part to look at when that figure moves.

Not a table row (no ``run()``): a tool for whoever changes the driver or its client.
"""

from __future__ import annotations

import json
import subprocess
import sys

from bench.table import Row, render

DEVICE_PLUGIN_SERVE = (
    "plugin.cli.main", "plugin.process.daemon", "plugin.serving.deviceplugin.server",
    "plugin.serving.deviceplugin.channels", "plugin.process.dirwatch", "grpc_health.v1.health",
)
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("standard library httpx2 imports", (
        "email.message", "email.parser", "http.client", "http.cookiejar", "urllib.request",
        "importlib.metadata", "zipfile", "csv", "mimetypes", "unicodedata", "platform")),
    ("anyio, h11, idna, truststore", ("anyio", "anyio.streams.tls", "h11", "idna", "truststore")),
    ("h2, hpack, hyperframe (HTTP/2, unused)", ("h2.connection", "h2.events", "hpack",
                                                "hyperframe.frame")),
    ("httpcore2, httpx2", ("httpcore2", "httpx2")),
    ("PyYAML", ("yaml",)),
    ("msgspec", ("msgspec", "msgspec.json")),
    ("lightkube (models, config, clients)", ("lightkube", "lightkube.generic_resource",
                                             "lightkube.config.client_adapter")),
    ("the driver's own modules", ("plugin.process.dra_side", "plugin.serving.dra.driver")),
)

_PROBE = """
import importlib, json, sys, tracemalloc
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
for name in BASE:
    importlib.import_module(name)
base = rss()
measure = tracemalloc.get_traced_memory if TRACE else lambda: (rss() * 2**20, 0)
if TRACE:
    tracemalloc.start(1)
figures = []
for title, names in LAYERS:
    before = measure()[0]
    for name in names:
        importlib.import_module(name)
    figures.append((measure()[0] - before) / 2**20)
print(json.dumps({"base": base, "layers": figures}))
"""


def measure() -> tuple[float, list[tuple[str, float, float]]]:
    """(VmRSS of the device-plugin imports, [(layer, heap MiB, RSS MiB)]) in a fresh
    interpreter, so nothing this process imported counts."""
    results = []
    for trace in (True, False):
        script = f"BASE = {DEVICE_PLUGIN_SERVE!r}\nLAYERS = {LAYERS!r}\nTRACE = {trace}\n{_PROBE}"
        out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True,
                             text=True).stdout
        results.append(json.loads(out))
    traced, plain = results
    return plain["base"], [(title, heap, rss) for (title, _), heap, rss
                           in zip(LAYERS, traced["layers"], plain["layers"], strict=True)]


def rows() -> list[Row]:
    base, layers = measure()
    table = [Row("device-plugin serve's imports", f"{base:.1f} MiB", "",
                 "VmRSS of the interpreter")]
    for title, heap, rss in layers:
        table.append(Row(title, f"+{heap:.2f} MiB heap", "", f"VmRSS {rss:+.2f} MiB"))
    heap_total = sum(heap for _, heap, _ in layers)
    rss_total = sum(rss for _, _, rss in layers)
    table.append(Row("DRA imports in all", f"+{heap_total:.2f} MiB heap", "",
                     f"VmRSS {rss_total:+.2f} MiB; the rest of what DRA adds is run time"))
    return table


if __name__ == "__main__":
    print(render(rows()))
