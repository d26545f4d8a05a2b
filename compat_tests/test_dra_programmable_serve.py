"""``serve --api dra`` publishes what a DeviceClass needs to place a function: each device's
interface, what it holds, and ``programmable``, which follows ``--programming`` (flag or
variable) and the FME node while the daemon runs.

The real process against the emulated 1.36 API server and kubelet; every slice it writes is
validated by the server's own schema on the way in, and again here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from compat_tests.apiserver import ApiServerEmulator, validate
from compat_tests.conftest import FAST_DRA
from compat_tests.dra_support import until, wiper
from compat_tests.fake_alveo import DEFAULT_LOGIC_UUID, build_mixed_node, load_xclbin
from compat_tests.fake_sysfs import DEFAULT_AFU_ID, DEFAULT_INTERFACE_ID, FakeNode
from compat_tests.kubelet import KubeletEmulator
from compat_tests.kubelet.dra import DraConfig
from compat_tests.plugin_process import PluginProcess

NODE = "node-a"
DRIVER = "accelerator.b-com.com"
XCLBIN = "8b5a2f60-3d1e-4c0a-9f3b-6a7e2d1c0b94"
DFL_PORT = "pci-0000-d8-00-0"
OPAE_PORT = "pci-0000-5e-00-0"
ALVEO = "pci-0000-17-00-1"
COUNT = 6
"""Two Intel ports, an F1 and an F2 slot, two Alveo cards (``build_mixed_node``)."""


def published(api: ApiServerEmulator) -> dict[str, dict[str, Any]]:
    """Device name -> its attributes as plain values, from every slice of the node."""
    return {d["name"]: {k: next(iter(v.values())) for k, v in d.get("attributes", {}).items()}
            for s in api.list("resourceslices") if s["spec"]["nodeName"] == NODE
            for d in s["spec"].get("devices", [])}


async def running(tmp_path: Path, sockdir: Path, logdir: Path,
                  extra: list[str]) -> AsyncIterator[tuple[ApiServerEmulator, FakeNode]]:
    fake = build_mixed_node(tmp_path / "node")
    load_xclbin(fake, "0000:17:00.1", XCLBIN)
    registry = sockdir / "registry"
    registry.mkdir()
    async with ApiServerEmulator("1.36") as api:
        api.create_node(NODE)
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        config = DraConfig(**FAST_DRA, node_name=NODE, wipe_slices=wiper(api))
        kubelet = KubeletEmulator(sockdir, "1.36", plugins_registry=registry,
                                  reconcile_period=0.05, dra=config)
        await kubelet.start()
        plugin = PluginProcess(sockdir, logdir, extra=[
            "--api", "dra", "--node-name", NODE, "--kubeconfig", str(kubeconfig),
            "--plugins-registry-dir", str(registry), "--dra-state-dir", str(sockdir / "state"),
            "--cdi-spec-dir", str(tmp_path / "cdi"), "--backend", "auto",
            "--sysfs-root", str(fake.sysfs_root), "--dev-root", str(fake.dev_root),
            *extra]).start()
        try:
            await until(lambda: len(published(api)) == COUNT, "every device published")
            yield api, fake
        finally:
            plugin.kill()
            await kubelet.stop()


@pytest.fixture
async def programming_on(tmp_path: Path, sockdir: Path, logdir: Path,
                         ) -> AsyncIterator[tuple[ApiServerEmulator, FakeNode]]:
    async for world in running(tmp_path, sockdir, logdir, ["--programming", "on"]):
        yield world


async def test_slices_carry_the_interface_the_function_and_programmable(programming_on):
    api, _ = programming_on
    for obj in api.list("resourceslices"):
        assert validate(obj, "v1", model="1.36", schema_required=True) == [], obj
    devices = published(api)
    port = devices[DFL_PORT]
    assert (port["afuID"], port["interfaceID"]) == (DEFAULT_AFU_ID, DEFAULT_INTERFACE_ID)
    assert port["programmable"] is True and devices[OPAE_PORT]["programmable"] is True
    card = devices[ALVEO]
    assert (card["logicUUID"], card["xclbinUUID"]) == (DEFAULT_LOGIC_UUID, XCLBIN)
    assert card["programmable"] is False  # no xbutil on this machine, whatever the flag says
    slots = [d for d in devices.values() if d["family"] == "aws"]
    assert len(slots) == 2 and not any(d["programmable"] for d in slots)  # nor AWS SDK


async def test_programmable_follows_the_fme_node_while_serving(programming_on):
    api, fake = programming_on
    fake.delete_fme_node("0000:d8:00.0")
    await until(lambda: published(api)[DFL_PORT]["programmable"] is False,
                "the port without its FME node republished as not programmable")
    assert published(api)[OPAE_PORT]["programmable"] is True
    fake.restore_fme_node("0000:d8:00.0")
    await until(lambda: published(api)[DFL_PORT]["programmable"] is True,
                "the port programmable again once its FME node is back")


@pytest.mark.parametrize("how", ["default", "flag-off", "variable-on"])
async def test_programmable_follows_the_setting(how, tmp_path, sockdir, logdir, monkeypatch):
    extra = {"default": [], "flag-off": ["--programming", "off"], "variable-on": []}[how]
    if how == "variable-on":
        monkeypatch.setenv("ACCELERATOR_DP_PROGRAMMING", "on")
    async for api, _ in running(tmp_path, sockdir, logdir, extra):
        devices = published(api)
        expected = how == "variable-on"
        assert devices[DFL_PORT]["programmable"] is expected
        assert devices[OPAE_PORT]["programmable"] is expected
        assert devices[ALVEO]["programmable"] is False
        assert devices[DFL_PORT]["afuID"] == DEFAULT_AFU_ID  # the facts do not depend on it
