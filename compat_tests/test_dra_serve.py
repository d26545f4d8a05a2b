"""DRA end to end: the real ``serve --api dra`` process between an emulated API server and an
emulated kubelet DRA manager, both of the release named, over real sockets and real HTTP.

What a cluster would see: the node's devices as ResourceSlices the server validates, claims
prepared and unprepared as the kubelet calls for them (with the CDI IDs a runtime resolves),
slices back within a second of a kubelet start wiping them, a plugin restarted between
prepare and unprepare losing nothing, hostile or stale claims refused one by one, an API
server outage answered with a clear per-claim error while serving goes on.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from compat_tests.apiserver import ApiServerEmulator, validate
from compat_tests.conftest import FAST_DRA
from compat_tests.dra_support import until, wiper
from compat_tests.fake_sysfs import CRASHED_AFU_ID, FakeNode
from compat_tests.kubelet import KubeletEmulator
from compat_tests.kubelet.dra import DraConfig
from compat_tests.kubelet.dra_results import ClaimRef
from compat_tests.plugin_process import PluginProcess

NODE = "node-a"
DRIVER = "accelerator.b-com.com"
SETTLE = 15.0
NAMESPACE = "default"


@dataclass
class DraWorld:
    api: ApiServerEmulator
    kubelet: KubeletEmulator
    plugin: PluginProcess
    fake: FakeNode
    cdi: Path
    config: DraConfig
    sockdir: Path
    registry: Path
    ports: dict[str, list[str]]

    def slices(self) -> list[dict[str, Any]]:
        return [s for s in self.api.list("resourceslices") if s["spec"]["nodeName"] == NODE]

    def device_names(self) -> list[str]:
        return sorted(d["name"] for s in self.slices() for d in s["spec"].get("devices", []))

    def claim(self, name: str, devices: list[str], **knobs: Any) -> ClaimRef:
        obj = self.api.create_allocated_claim(NAMESPACE, name, driver=DRIVER,
                                              pool=knobs.pop("pool", NODE), devices=devices,
                                              node_name=NODE, **knobs)
        return ClaimRef(NAMESPACE, name, obj["metadata"]["uid"], (DRIVER,))

    async def restart_kubelet(self, model: str = "1.36") -> None:
        await self.kubelet.stop()
        self.kubelet = KubeletEmulator(self.sockdir, model, plugins_registry=self.registry,
                                       reconcile_period=0.05, dra=self.config)
        await self.kubelet.start()


def serve(sockdir: Path, logdir: Path, registry: Path, fake: FakeNode, kubeconfig: Path,
          cdi: Path, name: str = "plugin") -> PluginProcess:
    return PluginProcess(sockdir, logdir, name=name, extra=[
        "--api", "dra", "--node-name", NODE, "--kubeconfig", str(kubeconfig),
        "--plugins-registry-dir", str(registry), "--dra-state-dir", str(sockdir / "state"),
        "--cdi-spec-dir", str(cdi), "--backend", "intel", "--sysfs-root",
        str(fake.sysfs_root), "--dev-root", str(fake.dev_root)]).start()


@pytest.fixture
async def world(sockdir: Path, logdir: Path, tmp_path: Path) -> AsyncIterator[DraWorld]:
    fake = FakeNode(tmp_path / "node")
    ports = {bus: fake.add_dfl_card(f"0000:{bus}:00.0", ports=2)
             for bus in ("3b", "5e", "86", "af")}
    registry = sockdir / "registry"
    registry.mkdir()
    cdi = tmp_path / "cdi"
    async with ApiServerEmulator("1.36") as api:
        api.create_node(NODE)
        api.create_namespace(NAMESPACE)
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        config = DraConfig(**FAST_DRA, node_name=NODE, wipe_slices=wiper(api))
        kubelet = KubeletEmulator(sockdir, "1.36", plugins_registry=registry,
                                  reconcile_period=0.05, dra=config)
        await kubelet.start()
        plugin = serve(sockdir, logdir, registry, fake, kubeconfig, cdi)
        state = DraWorld(api, kubelet, plugin, fake, cdi, config, sockdir, registry, ports)
        try:
            await until(lambda: len(state.device_names()) == 8, "eight ports published")
            assert kubelet.dra is not None
            await kubelet.dra.wait_until(lambda: kubelet.dra.endpoints(DRIVER), SETTLE,
                                         "driver registered")
            yield state
        finally:
            state.plugin.kill()
            await state.kubelet.stop()


def names(world: DraWorld, count: int) -> list[str]:
    return world.device_names()[:count]


@pytest.mark.parametrize("count", [1, 2, 8])
async def test_prepare_and_unprepare_hand_over_cdi_ids(world, count):
    [published] = world.slices()
    assert validate(published, "v1") == []
    claim = world.claim(f"claim-{count}", names(world, count))
    outcome = await world.kubelet.dra.prepare([claim])
    assert outcome.ok, outcome.error
    result = outcome.result(claim.uid)
    assert sorted(d.device_name for d in result.devices) == names(world, count)
    ids = outcome.cdi_ids(claim.uid)
    specs = [json.loads(p.read_text()) for p in world.cdi.glob("*.json")]
    known = {f"{s['kind']}={d['name']}" for s in specs for d in s["devices"]}
    assert ids and set(ids) <= known, "every CDI ID names a device of a spec on disk"
    claim_env = [e for s in specs for d in s["devices"] for e in d["containerEdits"].get("env", [])
                 if f"{s['kind']}={d['name']}" in ids]
    assert any(e.startswith("ACCELERATOR_UNITS=") and e.count(",") == count - 1
               for e in claim_env), claim_env
    again = await world.kubelet.dra.prepare([claim])
    assert again.ok and again.cdi_ids(claim.uid) == ids, "idempotent"
    done = await world.kubelet.dra.unprepare([claim])
    assert done.ok, done.error


async def test_hostile_and_stale_claims_are_refused_one_by_one(world):
    good = world.claim("good", names(world, 1))
    foreign = world.claim("foreign", ["pci-0000-3b-00-0"], pool="node-b")
    unknown = world.claim("unknown", ["pci-0000-99-00-0"])
    world.api.create_claim(NAMESPACE, "pending", [("req-0", "fpga")])
    pending = ClaimRef(NAMESPACE, "pending",
                       world.api.get("resourceclaims", "pending", NAMESPACE)["metadata"]["uid"],
                       (DRIVER,))
    replaced = world.claim("replaced", names(world, 1))
    world.api.delete("resourceclaims", "replaced", NAMESPACE)
    world.claim("replaced", names(world, 1))  # same name, new UID
    outcome = await world.kubelet.dra.prepare([good, foreign, unknown, pending, replaced])
    assert outcome.result(good.uid).ok
    for bad, words in ((foreign, "other pools"), (unknown, "does not have"),
                       (pending, "not allocated"), (replaced, "UID")):
        result = outcome.result(bad.uid)
        assert result.answered and not result.ok, bad
        assert words in result.error, (bad.name, result.error)


async def test_a_thousand_claims_in_one_call(world):
    claims = [world.claim(f"c{i}", names(world, 1)) for i in range(1000)]
    outcome = await world.kubelet.dra.prepare(claims)
    assert outcome.ok, outcome.error
    assert all(outcome.result(c.uid).ok for c in claims)


async def test_kubelet_restart_puts_slices_back(world):
    """How soon is bench/dra.py's ("kubelet start wipe -> all back")."""
    claim = world.claim("kept", names(world, 2))
    assert (await world.kubelet.dra.prepare([claim])).ok
    before = {s["metadata"]["uid"] for s in world.slices()}
    await world.restart_kubelet()
    await until(lambda: any(w.ok for w in world.kubelet.dra.slice_wipes), "the kubelet's wipe")
    await until(lambda: len(world.device_names()) == 8, "slices back after the wipe")
    assert not before & {s["metadata"]["uid"] for s in world.slices()}, \
        "published anew, not the old objects"
    await world.kubelet.dra.wait_until(lambda: world.kubelet.dra.endpoints(DRIVER), SETTLE,
                                       "registered with the new kubelet")
    done = await world.kubelet.dra.unprepare([claim])
    assert done.ok, "a claim prepared before the restart is unprepared after it"


async def test_plugin_restart_between_prepare_and_unprepare_loses_nothing(
        world, sockdir, logdir, tmp_path):
    claim = world.claim("survivor", names(world, 2))
    first = await world.kubelet.dra.prepare([claim])
    assert first.ok
    assert await world.plugin.terminate() == 0
    world.api.delete("resourceclaims", "survivor", NAMESPACE)  # gone while the plugin was
    world.plugin = serve(sockdir, logdir, world.registry, world.fake,
                         tmp_path / "kubeconfig", world.cdi, name="plugin-again")
    await world.kubelet.dra.wait_until(lambda: world.kubelet.dra.endpoints(DRIVER), SETTLE,
                                       "registered again")
    # The kubelet answers a claim it prepared from its own cache: one that lost its record
    # calls the driver again, which must answer from its checkpoint.
    world.kubelet.dra.config.checkpoint.claims.pop((NAMESPACE, "survivor"))
    again = await world.kubelet.dra.prepare([claim])
    assert again.ok and not again.result(claim.uid).skipped, again
    assert again.cdi_ids(claim.uid) == first.cdi_ids(claim.uid), \
        "answered from the checkpoint, without the API server"
    assert (await world.kubelet.dra.unprepare([claim])).ok


async def test_an_api_server_outage_is_a_per_claim_error_and_serving_goes_on(world):
    claim = world.claim("during-outage", names(world, 1))
    await world.api.go_down()
    outcome = await world.kubelet.dra.prepare([claim])
    result = outcome.result(claim.uid)
    assert result.answered and not result.ok
    assert "API server" in result.error
    await world.api.come_back()
    assert (await world.kubelet.dra.prepare([claim])).ok
    assert world.plugin.alive


async def test_a_crash_reaches_the_slices(world):
    """How soon is bench/dra.py's ("AFU crash -> device tainted")."""
    world.fake.set_afu_id(world.ports["5e"][0], CRASHED_AFU_ID)
    await until(lambda: any(
        d.get("taints") for s in world.slices() for d in s["spec"]["devices"]
        if d["name"] == "pci-0000-5e-00-0"), "crashed port tainted")
