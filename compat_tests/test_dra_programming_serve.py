"""``serve --api dra --programming on`` loads the function a claim names, as a kubelet sees it.

The real process, an emulated 1.36 API server and kubelet, a fake node of every family, and
stand-ins for the vendor tools (:mod:`compat_tests.fake_fpga_tools`) that take the real
tools' arguments and change the fake sysfs as a real load changes the real one. Each claim
is allocated with the configuration the scheduler copies from a DeviceClass
(``status.allocation.devices.config``, ``source: FromClass``), validated by the server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from compat_tests.apiserver import ApiServerEmulator, objects
from compat_tests.conftest import FAST_DRA
from compat_tests.dra_support import until, wiper
from compat_tests.fake_alveo import DEFAULT_INTERFACE_UUID as ALVEO_INTERFACE
from compat_tests.fake_alveo import build_mixed_node
from compat_tests.fake_fpga_tools import StandInTools, write_stand_in_tools
from compat_tests.fake_sysfs import DEFAULT_AFU_ID, DEFAULT_INTERFACE_ID, FakeNode
from compat_tests.fpga_images import (
    NLB3_AFU_ID,
    XCLBIN_UUID,
    XclbinSpec,
    build_gbs,
    build_xclbin,
    write_image,
)
from compat_tests.kubelet import KubeletEmulator
from compat_tests.kubelet.dra import DraConfig
from compat_tests.kubelet.dra_results import ClaimRef
from compat_tests.plugin_process import PluginProcess
from plugin.programming.ids import dashed

NODE = "node-a"
DRIVER = "accelerator.b-com.com"
NAMESPACE = "default"
DFL_PORT = "pci-0000-d8-00-0"
DFL_BDF = "0000:d8:00.0"
ALVEO = "pci-0000-17-00-1"
F1_SLOT = "pci-0000-00-0f-0"
AGFI = "agfi-0fcf87119b8e97bf3"
NLB3 = NLB3_AFU_ID.replace("-", "")
COUNT = 6




def function(**fields: Any) -> dict[str, Any]:
    return {"source": "FromClass", "requests": ["fpga"], "opaque": {"driver": DRIVER,
            "parameters": {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "FpgaFunction",
                           **fields}}}


@dataclass
class World:
    api: ApiServerEmulator
    kubelet: KubeletEmulator
    node: FakeNode
    tools: StandInTools
    plugin: PluginProcess
    library: Path
    restart: Any
    """``restart(name, *flags)``: the same serve command started anew (same state
    directory), ``flags`` added after the first run's (the last of a flag wins)."""

    def published(self) -> dict[str, dict[str, Any]]:
        return {d["name"]: {**{k: next(iter(v.values()))
                               for k, v in d.get("attributes", {}).items()},
                            "taints": d.get("taints", [])}
                for s in self.api.list("resourceslices") if s["spec"]["nodeName"] == NODE
                for d in s["spec"].get("devices", [])}

    def claim(self, name: str, device: str, *config: dict[str, Any]) -> ClaimRef:
        self.api.create_claim(NAMESPACE, name, [("fpga", DRIVER)])
        allocation = objects.allocation([objects.result("fpga", DRIVER, NODE, device)],
                                        node_name=NODE, config=config)
        obj = self.api.set_claim_status(NAMESPACE, name, {
            "allocation": allocation,
            "reservedFor": [objects.pod_reference(f"{name}-pod", f"{name}-pod-uid")]})
        return ClaimRef(NAMESPACE, name, obj["metadata"]["uid"], (DRIVER,))

    async def prepare(self, ref: ClaimRef) -> Any:
        assert self.kubelet.dra is not None
        return (await self.kubelet.dra.prepare([ref])).result(ref.uid)

    def events(self, reason: str) -> list[dict[str, Any]]:
        return [e for e in self.api.list("events", "default") if e["reason"] == reason]


async def running(tmp_path: Path, sockdir: Path, logdir: Path, *extra: str,
                  fail: str | None = None, delay: float = 0.0,
                  call_timeout: float | None = None,
                  api_server: Callable[[], ApiServerEmulator] | None = None,
                  before: Callable[[ApiServerEmulator, FakeNode], None] = lambda _a, _n: None
                  ) -> AsyncIterator[World]:
    """The world, its API server made by ``api_server`` (by default a 1.36 one), and
    ``before(api, node)`` called before serve starts."""
    node = build_mixed_node(tmp_path / "node")
    library = tmp_path / "images"
    write_image(library, "intel/nlb3.gbs", build_gbs(
        afu_ids=(NLB3_AFU_ID,), interface_id=dashed(DEFAULT_INTERFACE_ID)))
    # A good image outside the library, and a link to it inside: never to be read.
    outside = write_image(tmp_path / "outside", "nlb3.gbs", build_gbs(
        afu_ids=(NLB3_AFU_ID,), interface_id=dashed(DEFAULT_INTERFACE_ID)))
    (library / "escape.gbs").symlink_to(outside)
    write_image(library, "alveo/app.xclbin", build_xclbin(XclbinSpec(
        interface_uuid=dashed(ALVEO_INTERFACE))))
    tools = write_stand_in_tools(tmp_path / "tools", node, fail=fail, delay=delay)
    registry = sockdir / "registry"
    registry.mkdir()
    async with (api_server or (lambda: ApiServerEmulator("1.36")))() as api:
        api.create_node(NODE)
        api.create_namespace(NAMESPACE)
        api.create_device_class(DRIVER, driver=DRIVER)
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        before(api, node)
        kubelet = KubeletEmulator(sockdir, "1.36", plugins_registry=registry,
                                  reconcile_period=0.05,
                                  dra=DraConfig(**FAST_DRA, node_name=NODE,
                                                wipe_slices=wiper(api),
                                                **({"call_timeout": call_timeout}
                                                   if call_timeout else {})))
        await kubelet.start()
        arguments = [
            "--api", "dra", "--node-name", NODE, "--kubeconfig", str(kubeconfig),
            "--plugins-registry-dir", str(registry), "--dra-state-dir", str(sockdir / "state"),
            "--cdi-spec-dir", str(tmp_path / "cdi"), "--backend", "auto",
            "--sysfs-root", str(node.sysfs_root), "--dev-root", str(node.dev_root),
            "--health-interval", "0.1", "--programming", "on", "--intel-loader", "fpgaconf",
            "--image-library", str(library), "--fpgaconf", str(tools.fpgaconf),
            "--xbutil", str(tools.xbutil), "--fpga-load-local-image", str(tools.load),
            "--fpga-describe-local-image", str(tools.describe), "--program-timeout", "20",
            *extra]
        plugin = PluginProcess(sockdir, logdir, extra=arguments).start()
        world = World(api, kubelet, node, tools, plugin, library,
                      lambda name, *flags: PluginProcess(
                          sockdir, logdir, extra=[*arguments, *flags], name=name).start())
        try:
            await until(lambda: len(world.published()) == COUNT, "every device published")
            assert kubelet.dra is not None
            await kubelet.dra.wait_until(lambda: kubelet.dra.endpoints(DRIVER), 15.0,
                                         "driver registered")
            yield world
        finally:
            world.plugin.kill()
            await kubelet.stop()


@pytest.fixture
async def world(tmp_path: Path, sockdir: Path, logdir: Path) -> AsyncIterator[World]:
    async for w in running(tmp_path, sockdir, logdir):
        yield w


@pytest.fixture
async def failing(tmp_path: Path, sockdir: Path, logdir: Path) -> AsyncIterator[World]:
    """The world with tools whose every load fails at the hardware step."""
    async for w in running(tmp_path, sockdir, logdir, fail="PR failed: timeout"):
        yield w


async def test_a_port_holding_another_function_is_loaded_before_the_claim_is_answered(
        world: World) -> None:
    assert world.published()[DFL_PORT]["afuID"] == DEFAULT_AFU_ID
    ref = world.claim("nlb3", DFL_PORT, function(afuID=NLB3_AFU_ID, image="intel/nlb3.gbs"))
    result = await world.prepare(ref)
    assert result.ok, result.error
    assert result.devices and result.devices[0].cdi_device_ids
    # The tool ran once, on that card, with the sealed copy of the library file's checked
    # bytes (never the path, which it would read again); discovery reads the function.
    [argv] = world.tools.invocations("fpgaconf")
    assert argv[:8] == ["--segment", "0x0000", "--bus", "0xd8", "--device", "0x00",
                        "--function", "0x0"]
    assert argv[8].startswith("/proc/self/fd/")
    await until(lambda: world.published()[DFL_PORT]["afuID"] == NLB3,
                "the slice republished with the new AFU ID")
    # What kubectl describe shows: the claim's device status and the Node's Event.
    await until(lambda: _status(world, "nlb3"), "the claim's device status written")
    entry = _status(world, "nlb3")[0]
    assert entry["data"]["function"] == f"afuID {NLB3}"
    assert entry["data"]["functionImage"] == "intel/nlb3.gbs"
    assert "loaded by fpgaconf in" in entry["data"]["functionLoaded"]
    loaded = next(c for c in entry["conditions"] if c["type"] == "FunctionLoaded")
    assert (loaded["status"], loaded["reason"]) == ("True", "Loaded")
    await until(lambda: world.events("FunctionLoaded"), "a FunctionLoaded Event")
    assert DFL_BDF in world.events("FunctionLoaded")[0]["note"]
    # The next claim for the same function: nothing loaded (the fast path).
    again = world.claim("nlb3-again", DFL_PORT,
                        function(afuID=NLB3_AFU_ID, image="intel/nlb3.gbs"))
    assert (await world.prepare(again)).ok
    assert len(world.tools.invocations("fpgaconf")) == 1


async def test_a_device_another_prepared_claim_holds_is_not_reprogrammed(world: World) -> None:
    first = world.claim("plain", DFL_PORT)  # no function named: prepared as it is
    assert (await world.prepare(first)).ok
    second = world.claim("nlb3", DFL_PORT, function(afuID=NLB3_AFU_ID, image="intel/nlb3.gbs"))
    result = await world.prepare(second)
    assert "never reprogrammed under a claim that holds it" in result.error
    assert "default/plain" in result.error
    assert world.tools.invocations("fpgaconf") == []


@pytest.mark.parametrize(("config", "words"), [
    (function(afuID=NLB3_AFU_ID, image="intel/nlb3.gbs", imag="x"),
     "unknown field 'imag' (did you mean 'image'?)"),
    (function(afuID=NLB3_AFU_ID, image="../tools/fpgaconf"), "must be a path inside"),
    (function(afuID=NLB3_AFU_ID, image="escape.gbs"), "outside the image library"),
    (function(afuID=DEFAULT_AFU_ID, image="intel/nlb3.gbs"), "holds AFU ID f7df405c"),
    (function(xclbinUUID=XCLBIN_UUID, image="alveo/app.xclbin"),
     "a function of the alveo family, for a intel device"),
])
async def test_a_wrong_configuration_is_that_claims_error_and_touches_nothing(
        world: World, config: dict[str, Any], words: str) -> None:
    result = await world.prepare(world.claim("wrong", DFL_PORT, config))
    assert words in result.error
    assert world.tools.invocations() == []
    assert world.plugin.alive


async def test_an_alveo_card_and_an_aws_slot_are_loaded_by_their_tools(world: World) -> None:
    card = await world.prepare(world.claim(
        "xclbin", ALVEO, function(xclbinUUID=XCLBIN_UUID, image="alveo/app.xclbin")))
    assert card.ok, card.error
    await until(lambda: world.published()[ALVEO].get("xclbinUUID") == XCLBIN_UUID,
                "the xclbin published as loaded")
    slot = await world.prepare(world.claim("afi", F1_SLOT, function(agfiID=AGFI)))
    assert slot.ok, slot.error
    assert [argv[:4] for argv in world.tools.invocations("fpga-load-local-image")] == [
        ["-S", "0", "-I", AGFI]]
    # Held now: the describe says so, and a second claim loads nothing.
    assert (await world.prepare(world.claim("afi-2", F1_SLOT, function(agfiID=AGFI)))).ok
    assert len(world.tools.invocations("fpga-load-local-image")) == 1


async def test_a_failed_load_is_the_claims_error_and_leaves_the_device_unhealthy(
        failing: World, tmp_path: Path) -> None:
    world = failing
    ref = world.claim("nlb3", DFL_PORT, function(afuID=NLB3_AFU_ID, image="intel/nlb3.gbs"))
    result = await world.prepare(ref)
    assert "failed at fpgaconf" in result.error and "PR failed: timeout" in result.error
    await until(lambda: world.published()[DFL_PORT]["taints"],
                "the device tainted: its state is unknown")
    assert world.published()[DFL_PORT]["taints"][0]["effect"] == "NoSchedule"
    await until(lambda: _health(world, DFL_PORT) == "Unhealthy",
                "the kubelet told it is Unhealthy")
    await until(lambda: world.events("FunctionLoadFailed"), "a FunctionLoadFailed Event")
    assert "PR failed: timeout" in world.events("FunctionLoadFailed")[0]["note"]
    # A restarted plugin remembers: the record is in its state directory.
    world.plugin.kill()
    world.plugin = world.restart("plugin-again")
    await until(lambda: _health(world, DFL_PORT) == "Unhealthy" and
                world.plugin.text().count("devices Unhealthy since a failed load") == 1,
                "Unhealthy again after the restart")
    # The tools mended, a load that works makes the device sound again.
    write_stand_in_tools(tmp_path / "tools", world.node)
    again = world.claim("nlb3-again", DFL_PORT,
                        function(afuID=NLB3_AFU_ID, image="intel/nlb3.gbs"))
    result = await world.prepare(again)
    assert result.ok, result.error
    await until(lambda: not world.published()[DFL_PORT]["taints"], "untainted")
    await until(lambda: _health(world, DFL_PORT) == "Healthy", "Healthy to the kubelet")


@pytest.fixture
async def slow(tmp_path: Path, sockdir: Path, logdir: Path) -> AsyncIterator[World]:
    """Loads that take 3 s, and a kubelet that gives each call 1.5 s."""
    async for w in running(tmp_path, sockdir, logdir, delay=3.0, call_timeout=1.5):
        yield w


async def test_a_load_longer_than_the_kubelets_call_goes_on_and_is_found_done(
        slow: World) -> None:
    ref = slow.claim("nlb3", DFL_PORT, function(afuID=NLB3_AFU_ID, image="intel/nlb3.gbs"))
    first = await slow.prepare(ref)
    # Answered before the kubelet's deadline, saying why: the load is still going on.
    assert f"still loading afuID {NLB3_AFU_ID} onto {DFL_BDF}" in first.error, first.error
    # The kubelet calls again, as it does: the load was not cut off, and is not started twice.
    await until(lambda: slow.published()[DFL_PORT]["afuID"] == NLB3, "the load done", 10.0)
    again = await slow.prepare(ref)
    assert again.ok, again.error
    assert len(slow.tools.invocations("fpgaconf")) == 1
    assert not slow.published()[DFL_PORT]["taints"]


def _status(world: World, claim: str) -> list[dict[str, Any]]:
    obj = world.api.get("resourceclaims", claim, NAMESPACE)
    return list((obj or {}).get("status", {}).get("devices", []))


def _health(world: World, device: str) -> str | None:
    dra = world.kubelet.dra
    assert dra is not None
    record = dra.health(DRIVER).get((NODE, device))
    return None if record is None else record.health


async def test_what_was_loaded_stays_in_the_claims_status_across_a_restart(world: World) -> None:
    ref = world.claim("nlb3", DFL_PORT, function(afuID=NLB3_AFU_ID, image="intel/nlb3.gbs"))
    assert (await world.prepare(ref)).ok
    await until(lambda: _status(world, "nlb3"), "the claim's device status written")
    world.plugin.kill()
    world.api.clear_requests()
    world.plugin = world.restart("plugin-again")
    # The restarted plugin writes the status of the claims it holds again (server-side
    # apply: what it leaves out is removed); what was loaded is still there.
    await until(lambda: [r for r in world.api.find_requests(verb="patch", status=200)
                         if r.subresource == "status" and r.name == "nlb3"],
                "the status written again by the restarted plugin")
    entry = _status(world, "nlb3")[0]
    assert "loaded by fpgaconf in" in entry["data"]["functionLoaded"]
    assert any(c["type"] == "FunctionLoaded" for c in entry["conditions"])


async def test_a_claim_refused_for_its_second_device_changes_no_card(world: World) -> None:
    world.api.create_claim(NAMESPACE, "two", [("fpga", DRIVER)])
    allocation = objects.allocation(
        [objects.result("fpga", DRIVER, NODE, DFL_PORT), objects.result("fpga", DRIVER, NODE,
                                                                        ALVEO)],
        node_name=NODE, config=[function(afuID=NLB3_AFU_ID, image="intel/nlb3.gbs")])
    obj = world.api.set_claim_status(NAMESPACE, "two", {"allocation": allocation})
    result = await world.prepare(ClaimRef(NAMESPACE, "two", obj["metadata"]["uid"], (DRIVER,)))
    assert "a function of the intel family, for a alveo device" in result.error
    assert world.tools.invocations() == []  # the first device was not loaded for nothing
    assert world.published()[DFL_PORT]["afuID"] == DEFAULT_AFU_ID


async def test_programming_on_the_device_plugin_says_it_does_nothing(sockdir: Path,
                                                                    logdir: Path) -> None:
    plugin = PluginProcess(sockdir, logdir, extra=["--programming", "on"]).start()
    try:
        await plugin.wait_for_log(
            lambda e: "--programming on has no effect with --api device-plugin" in
            e.get("message", ""), what="the warning")
        assert plugin.alive
    finally:
        plugin.kill()
