"""``serve --loader-socket`` with the real ``loader`` process: the driver loads nothing itself.

The real driver (DRA, ``--programming on``) and the real loader, two processes, on a fake
node with the stand-in tools, an emulated 1.36 API server and kubelet. The driver is given
no usable tool (``--fpgaconf`` names nothing), so a function that reaches the card reached
it through the loader. With the loader's socket missing, refusing or hung, the claim gets a
bounded error: untouched where nothing was sent, quarantined where the card's state is
unknown.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from compat_tests.apiserver import ApiServerEmulator
from compat_tests.conftest import FAST_DRA
from compat_tests.dra_support import until, wiper
from compat_tests.fake_alveo import build_mixed_node
from compat_tests.fake_fpga_tools import write_stand_in_tools
from compat_tests.fake_sysfs import DEFAULT_AFU_ID, DEFAULT_INTERFACE_ID
from compat_tests.fpga_images import NLB3_AFU_ID, build_gbs, write_image
from compat_tests.kubelet import KubeletEmulator
from compat_tests.kubelet.dra import DraConfig
from compat_tests.plugin_process import PluginProcess
from compat_tests.test_dra_programming_serve import (
    COUNT,
    DFL_BDF,
    DFL_PORT,
    DRIVER,
    NLB3,
    NODE,
    World,
    function,
)
from plugin.programming.ids import dashed

IMAGE = "intel/nlb3.gbs"


class LoaderProcess:
    """``python -m plugin loader`` on the fake node; its JSON log in ``<logdir>/loader.log``."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "plugin", "loader", "--log-format", "json", *args],
                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def messages(self) -> list[str]:
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        return [json.loads(line).get("message", "") if line.startswith("{") else line
                for line in lines]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


@contextlib.asynccontextmanager
async def world_with(tmp_path: Path, sockdir: Path, logdir: Path, socket: Path,
                     loader: bool, *, delay: float = 0.0, fail: str | None = None,
                     extra: tuple[str, ...] = ()
                     ) -> AsyncIterator[tuple[World, LoaderProcess | None]]:
    """The world; ``delay``/``fail`` for the stand-in tools, ``extra`` flags for serve;
    ``world.restart(name, *flags)`` starts serve anew with them."""
    node = build_mixed_node(tmp_path / "node")
    library = tmp_path / "images"
    write_image(library, IMAGE, build_gbs(afu_ids=(NLB3_AFU_ID,),
                                          interface_id=dashed(DEFAULT_INTERFACE_ID)))
    tools = write_stand_in_tools(tmp_path / "tools", node, delay=delay, fail=fail)
    node_flags = ["--backend", "auto", "--sysfs-root", str(node.sysfs_root), "--dev-root",
                  str(node.dev_root), "--image-library", str(library)]
    process = None
    if loader:
        process = LoaderProcess(loader_flags(node_flags, socket, tools.fpgaconf, sockdir),
                                logdir / "loader.log")
        await until(lambda: socket.exists(), "the loader's socket")
    registry = sockdir / "registry"
    registry.mkdir()
    async with ApiServerEmulator("1.36") as api:
        api.create_node(NODE)
        api.create_namespace("default")
        api.create_device_class(DRIVER, driver=DRIVER)
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        kubelet = KubeletEmulator(sockdir, "1.36", plugins_registry=registry,
                                  reconcile_period=0.05,
                                  dra=DraConfig(**FAST_DRA, node_name=NODE,
                                                wipe_slices=wiper(api)))
        await kubelet.start()
        arguments = [
            "--api", "dra", "--node-name", NODE, "--kubeconfig", str(kubeconfig),
            "--plugins-registry-dir", str(registry), "--dra-state-dir", str(sockdir / "state"),
            "--cdi-spec-dir", str(tmp_path / "cdi"), *node_flags, "--health-interval", "0.1",
            "--programming", "on", "--intel-loader", "fpgaconf",
            # Nothing the driver could run itself: a load must go through the loader.
            "--fpgaconf", str(tmp_path / "no-fpgaconf-here"), "--program-timeout", "3",
            "--loader-socket", str(socket), *extra]
        plugin = PluginProcess(sockdir, logdir, extra=arguments).start()
        world = World(api, kubelet, node, tools, plugin, library,
                      lambda name, *flags: PluginProcess(
                          sockdir, logdir, extra=[*arguments, *flags], name=name).start())
        try:
            await until(lambda: len(world.published()) == COUNT, "every device published")
            assert kubelet.dra is not None
            await kubelet.dra.wait_until(lambda: kubelet.dra.endpoints(DRIVER), 15.0,
                                         "driver registered")
            yield world, process
        finally:
            world.plugin.kill()
            await kubelet.stop()
            if process is not None:
                process.stop()


def loader_flags(node_flags: list[str], socket: Path, fpgaconf: Path, sockdir: Path
                 ) -> list[str]:
    """The loader's flags beside a driver whose state directory is ``sockdir/state``: the
    card locks and records are shared there."""
    return [*node_flags, "--loader-socket", str(socket), "--intel-loader", "fpgaconf",
            "--fpgaconf", str(fpgaconf), "--loader-allowed-uids", str(os.geteuid()),
            "--dra-state-dir", str(sockdir / "state")]


@pytest.fixture
def loader_socket(sockdir: Path) -> Path:
    return sockdir / "loader" / "l.sock"


async def test_a_claims_function_is_loaded_through_the_loader_process(
        tmp_path: Path, sockdir: Path, logdir: Path, loader_socket: Path) -> None:
    async with world_with(tmp_path, sockdir, logdir, loader_socket, True) as (world, loader):
        assert loader is not None
        assert world.published()[DFL_PORT]["programmable"] is True
        assert world.published()[DFL_PORT]["afuID"] == DEFAULT_AFU_ID
        result = await world.prepare(world.claim("nlb3", DFL_PORT,
                                                 function(afuID=NLB3_AFU_ID, image=IMAGE)))
        assert result.ok, result.error
        # fpgaconf ran once, in the loader, on the sealed copy of the checked bytes.
        [argv] = world.tools.invocations("fpgaconf")
        assert argv[:4] == ["--segment", "0x0000", "--bus", "0xd8"]
        assert argv[-1].startswith("/proc/self/fd/")
        await until(lambda: world.published()[DFL_PORT]["afuID"] == NLB3,
                    "the new AFU ID published")
        messages = loader.messages()
        assert any(m.startswith(f"loading {NLB3} ({IMAGE}) onto {DFL_BDF}") for m in messages)
        assert any("network namespace of its own" in m or "could not leave" in m
                   for m in messages)
        # The socket is the driver's alone.
        assert oct(loader_socket.stat().st_mode & 0o777) == "0o600"
        assert oct(loader_socket.parent.stat().st_mode & 0o777) == "0o700"
        assert loader.process.poll() is None and world.plugin.alive


async def test_a_missing_loader_leaves_nothing_programmable_and_the_claim_a_clear_error(
        tmp_path: Path, sockdir: Path, logdir: Path, loader_socket: Path) -> None:
    async with world_with(tmp_path, sockdir, logdir, loader_socket, False) as (world, _):
        assert world.published()[DFL_PORT]["programmable"] is False
        result = await world.prepare(world.claim("nlb3", DFL_PORT,
                                                 function(afuID=NLB3_AFU_ID, image=IMAGE)))
        assert "cannot be programmed" in result.error
        assert f"the loader process at {loader_socket} cannot be reached" in result.error
        assert world.tools.invocations() == []
        assert not world.published()[DFL_PORT]["taints"]  # untouched: not quarantined


async def test_a_loader_that_went_away_refuses_and_the_card_is_untouched(
        tmp_path: Path, sockdir: Path, logdir: Path, loader_socket: Path) -> None:
    async with world_with(tmp_path, sockdir, logdir, loader_socket, True) as (world, loader):
        assert loader is not None and world.published()[DFL_PORT]["programmable"] is True
        loader.stop()  # killed: its socket file stays, nothing listens (ECONNREFUSED)
        assert loader_socket.exists()
        result = await world.prepare(world.claim("nlb3", DFL_PORT,
                                                 function(afuID=NLB3_AFU_ID, image=IMAGE)))
        assert ("failed at reach loader" in result.error
                or "cannot be reached" in result.error), result.error
        assert world.tools.invocations() == []
        await asyncio.sleep(0.5)
        assert not world.published()[DFL_PORT]["taints"]
        assert world.published()[DFL_PORT]["afuID"] == DEFAULT_AFU_ID


async def test_a_hung_loader_is_a_bounded_error_and_the_device_quarantined(
        tmp_path: Path, sockdir: Path, logdir: Path, loader_socket: Path) -> None:
    """A loader that lists the port as programmable, then never answers the load."""
    loads: list[dict[str, Any]] = []

    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = json.loads(await reader.readline())
        if request["op"] == "inventory":
            writer.write(json.dumps({"ok": True, "devices": {DFL_BDF: None},
                                     "loaders": {"intel": "fpgaconf"}}).encode() + b"\n")
            await writer.drain()
            writer.close()
            return
        loads.append(request)
        await asyncio.sleep(3600)

    loader_socket.parent.mkdir(mode=0o700)
    hung = await asyncio.start_unix_server(hang, path=str(loader_socket))
    try:
        async with world_with(tmp_path, sockdir, logdir, loader_socket, False) as (world, _):
            await until(lambda: world.published()[DFL_PORT]["programmable"] is True,
                        "programmable, as the loader says")
            ref = world.claim("nlb3", DFL_PORT, function(afuID=NLB3_AFU_ID, image=IMAGE))
            started = time.monotonic()
            error = ""
            while "unknown" not in error and time.monotonic() - started < 30:
                error = (await world.prepare(ref)).error
            # --program-timeout 3 plus the client's 5 s grace (what is left of it): bounded,
            # and says so.
            given = re.search(r"gave no answer within ([0-9.]+) s", error)
            assert given is not None and 0 < float(given[1]) <= 3 + 5, error
            assert "failed at loader answer" in error and "is unknown" in error
            assert loads and loads[0]["device"] == DFL_BDF and loads[0]["image"] == IMAGE
            await until(lambda: world.published()[DFL_PORT]["taints"],
                        "the device tainted: what the card holds is unknown")
            assert world.plugin.alive
    finally:
        hung.close()


async def test_a_loader_that_comes_later_makes_the_devices_programmable_without_a_rescan(
        tmp_path: Path, sockdir: Path, logdir: Path, loader_socket: Path) -> None:
    """The published ``programmable`` follows the loader's own word (its inventory), not
    only changes of the devices: none of them changes here."""
    async with world_with(tmp_path, sockdir, logdir, loader_socket, False) as (world, _):
        assert world.published()[DFL_PORT]["programmable"] is False
        loader = LoaderProcess([
            "--backend", "auto", "--sysfs-root", str(world.node.sysfs_root), "--dev-root",
            str(world.node.dev_root), "--image-library", str(world.library),
            "--loader-socket", str(loader_socket), "--intel-loader", "fpgaconf",
            "--fpgaconf", str(world.tools.fpgaconf),
            "--loader-allowed-uids", str(os.geteuid()),
            "--dra-state-dir", str(sockdir / "state")], logdir / "loader-late.log")
        try:
            await until(lambda: world.published()[DFL_PORT]["programmable"] is True,
                        "programmable published once the loader answers", 25.0)
            result = await world.prepare(world.claim("nlb3", DFL_PORT,
                                                     function(afuID=NLB3_AFU_ID, image=IMAGE)))
            assert result.ok, result.error
        finally:
            loader.stop()


async def test_discover_asks_the_loader_process_as_serve_does(
        tmp_path: Path, sockdir: Path, logdir: Path, loader_socket: Path) -> None:
    """discover's PROGRAMMABLE is the driver's rule: given the loader's socket, it asks the
    loader, which alone holds the tools; without it answering, nothing is programmable."""
    async with world_with(tmp_path, sockdir, logdir, loader_socket, True) as (world, loader):
        assert loader is not None

        def discovered() -> dict[str, Any]:
            done = subprocess.run(
                [sys.executable, "-m", "plugin", "discover", "--json", "--backend", "auto",
                 "--sysfs-root", str(world.node.sysfs_root), "--dev-root",
                 str(world.node.dev_root), "--programming", "on", "--intel-loader",
                 "fpgaconf", "--fpgaconf", str(tmp_path / "no-fpgaconf-here"),
                 "--loader-socket", str(loader_socket)],
                capture_output=True, text=True, timeout=60, check=True)
            return {d["id"]: d for d in json.loads(done.stdout)}

        assert discovered()[DFL_BDF]["programmable"] is True
        loader.stop()
        port = discovered()[DFL_BDF]
        assert port["programmable"] is False
        assert "cannot be reached" in port["not_programmable_because"]
