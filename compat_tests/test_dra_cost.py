"""A node that does not use DRA pays nothing for it: the real serve process, with a kubelet.

The DRA driver and its API client (lightkube, httpx2) are imported only under ``--api dra`` or
``auto``. Checked on the real ``serve`` process registered with an emulated kubelet: a
``sitecustomize`` hook (how the fault tests reach into the process without touching its code)
writes the modules the process holds once it has served for a moment and is told to stop.
"""

from __future__ import annotations

import json
import os
import signal

from compat_tests.plugin_process import run_at_start_up
from compat_tests.test_matrix import assert_serves_units

DUMP_MODULES = """
import atexit, json, os, sys

def _dump():
    with open(os.environ["MODULES_OUT"], "w") as out:
        json.dump(sorted(sys.modules), out)

atexit.register(_dump)
"""
DRA_ONLY = ("lightkube", "httpx2", "httpcore2", "plugin.serving.dra.driver",
            "plugin.serving.dra.apiserver", "plugin.serving.dra.publisher",
            "plugin.process.events", "plugin.process.node_events", "plugin.serving.events_api",
            "plugin.programming.programmer", "plugin.programming.gbs",
            "plugin.programming.loaders.base")
"""Kubernetes Events (on by default with API access) are of the same kind: off by default
for the device plugin, and then not imported; so is programming (DRA only)."""


async def test_a_device_plugin_node_never_imports_the_dra_side(kubelet, plugin, tmp_path,
                                                                monkeypatch):
    out = tmp_path / "modules.json"
    monkeypatch.setenv("MODULES_OUT", str(out))
    run_at_start_up(DUMP_MODULES, tmp_path / "inject", monkeypatch)
    node = await kubelet("1.26")
    daemon = plugin()
    await assert_serves_units(node)
    os.kill(daemon.pid, signal.SIGTERM)
    assert await daemon.terminate() == 0
    held = set(json.loads(out.read_text()))
    assert "plugin.process.daemon" in held, "the dump is of the serve process"
    assert not [m for m in DRA_ONLY if m in held]


async def test_the_same_check_sees_the_dra_side_where_dra_is_asked_for(kubelet, plugin,
                                                                      tmp_path, monkeypatch):
    """The control: with --api dra the driver and its client are loaded (here against no API
    server at all), so the check above could see them if a device-plugin node loaded them."""
    out = tmp_path / "modules.json"
    monkeypatch.setenv("MODULES_OUT", str(out))
    run_at_start_up(DUMP_MODULES, tmp_path / "inject", monkeypatch)
    registry = tmp_path / "registry"
    registry.mkdir()
    daemon = plugin(extra=["--api", "dra", "--node-name", "node-a", "--kubeconfig",
                           str(tmp_path / "missing-kubeconfig"), "--plugins-registry-dir",
                           str(registry), "--dra-state-dir", str(tmp_path / "state"),
                           "--cdi-spec-dir", str(tmp_path / "cdi")])
    await daemon.wait_for_log(lambda e: "DRA driver" in e.get("message", ""),
                              what="the DRA driver's first word")
    os.kill(daemon.pid, signal.SIGTERM)
    assert await daemon.terminate() == 0
    held = set(json.loads(out.read_text()))
    assert {"lightkube", "plugin.serving.dra.driver", "plugin.process.node_events",
            "plugin.programming.programmer"} <= held
