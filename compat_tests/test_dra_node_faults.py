"""DRA faults a node throws, against the real ``serve --api dra`` process.

Between an emulated API server (``compat_tests/apiserver``) and an emulated 1.36 kubelet DRA
manager, over real sockets and real HTTP (:mod:`compat_tests.dra_bench`); each case turns
one fault on and asserts what a cluster would see: the slices converge, the kubelet's health
stream and prepare calls keep answering, requests stay bounded while the fault lasts, the
fault is logged once, and the process never has to be restarted to recover.

These are the node's faults: hot-plug and health changes, a stalled discovery, a corrupt
or torn checkpoint, and a second instance (a rolling update); the API server's are in
``test_dra_faults``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from compat_tests.dra_bench import (
    DRIVER,
    Bench,
    messages,
    port_device,
)
from compat_tests.dra_support import recorded_claims
from compat_tests.fake_sysfs import CRASHED_AFU_ID, DEFAULT_AFU_ID
from compat_tests.plugin_process import PluginProcess, run_at_start_up
from compat_tests.test_faults_discovery import HANGING_READS
from plugin.serving.dra.driver import CHECKPOINT_FILE


@pytest.fixture
def bench(dra_bench: Bench) -> Bench:
    """One node of emulated Kubernetes and a fake FPGA tree (compat_tests/conftest.py)."""
    return dra_bench


# -- 6. hot-plug and health, to the slices and to the kubelet's health stream ---------------


HEALTH_FAULTS = {
    "AFU crash": (lambda n, p: n.set_afu_id(p, CRASHED_AFU_ID),
                  lambda n, p: n.set_afu_id(p, DEFAULT_AFU_ID)),
    "port error": (lambda n, p: n.set_port_error(p, 0x1),
                   lambda n, p: n.set_port_error(p, 0)),
    "device node deleted": (lambda n, p: n.delete_device_node(p),
                            lambda n, p: n.restore_device_node(p)),
}


async def both_show(bench: Bench, plugin: PluginProcess, what: str,
                    in_slices: Callable[[], bool], in_health: Callable[[], bool]) -> None:
    """The slices and the kubelet's health stream both show it. How soon is bench/'s
    (dra.py: hot-plug and crash to the slices; hotplug.py and backend_health.py to the
    kubelet), not a test's: a wall-clock bound fails on a busy machine without a fault."""
    await asyncio.gather(
        bench.until_alive(plugin, in_slices, f"{what} in the slices"),
        bench.until_alive(plugin, in_health, f"{what} in the kubelet's health stream"))


@pytest.mark.parametrize("fault", list(HEALTH_FAULTS))
async def test_a_health_change_reaches_slices_and_health_stream(bench, fault):
    plugin = await bench.up()
    break_it, mend_it = HEALTH_FAULTS[fault]
    port, name = port_device(bench, "5e", 1)
    await bench.until_alive(plugin, lambda: bench.health_of(name) == "Healthy", "healthy")
    break_it(bench.fake, port)
    await both_show(bench, plugin, f"{fault} of {name}",
                    lambda: bench.tainted(name),
                    lambda: bench.health_of(name) == "Unhealthy")
    assert bench.health()[name].message, "the kubelet is told why"
    assert all(bench.health_of(n) == "Healthy" for n in bench.device_names() if n != name)
    mend_it(bench.fake, port)
    await both_show(bench, plugin, f"{name} mended",
                    lambda: bench.untainted(name),
                    lambda: bench.health_of(name) == "Healthy")


async def test_a_port_plugged_in_and_removed_reaches_slices_and_health(bench):
    plugin = await bench.up()
    before = set(bench.device_names())
    port = bench.fake.add_port("0000:3b:00.0")
    await both_show(bench, plugin, "new port",
                    lambda: len(bench.device_names()) == 9,
                    lambda: len(bench.health()) == 9)
    [added] = set(bench.device_names()) - before
    assert bench.untainted(added) and bench.health_of(added) == "Healthy"
    gone_port, gone = port_device(bench, "86", 1)
    bench.fake.remove_port(gone_port)
    bench.fake.remove_port(port)
    await both_show(bench, plugin, "two ports removed",
                    lambda: set(bench.device_names()) == before - {gone},
                    lambda: set(bench.health()) == before - {gone})


# -- 7. discovery stalled -------------------------------------------------------------------


STALL_TIMEOUT = 1.0


async def test_a_stalled_discovery_is_never_healthy_to_the_kubelet_nor_the_scheduler(
        bench, monkeypatch):
    run_at_start_up(HANGING_READS, bench.tmp / "inject", monkeypatch)
    marker = bench.tmp / "hang"
    monkeypatch.setenv("DP_TEST_HANG_MARKER", str(marker))
    await bench.start_api()
    await bench.start_kubelet()
    plugin = bench.serve(bench.kubeconfig(), extra=[
        "--scan-stall-timeout", str(STALL_TIMEOUT), "--rescan-interval", "0.5"])
    await bench.published(plugin)
    names = bench.device_names()
    await bench.until_alive(plugin, lambda: all(bench.health_of(n) == "Healthy" for n in names),
                            "all healthy")
    marker.touch()  # every afu_id read hangs from now on
    await both_show(
        bench, plugin, "stall",
        lambda: all(bench.tainted(n) for n in names),
        lambda: all(bench.health_of(n) in ("Unknown", "Unhealthy") for n in names))
    assert {bench.health_of(n) for n in names} == {"Unknown"}, "not known is Unknown"
    assert all("stalled" in (bench.health()[n].message or "") for n in names)
    marker.unlink()
    await both_show(bench, plugin, "discovery answering again",
                    lambda: all(bench.untainted(n) for n in names),
                    lambda: all(bench.health_of(n) == "Healthy" for n in names))


# -- 8. a corrupt checkpoint ----------------------------------------------------------------


@pytest.mark.parametrize("content", [b"{\"kind\": \"AcceleratorDraClaim", b"\x00" * 64, b""])
async def test_a_corrupt_checkpoint_is_set_aside_once_and_serving_goes_on(bench, content):
    await bench.start_api()
    await bench.start_kubelet()
    bench.state.mkdir()
    checkpoint = bench.state / CHECKPOINT_FILE
    checkpoint.write_bytes(content)
    plugin = bench.serve(bench.kubeconfig())
    await bench.published(plugin)
    said = [m for m in messages(plugin, "error") if "checkpoint" in m]
    assert len(said) == 1 and "unusable" in said[0], said
    [aside] = bench.state.glob(f"{CHECKPOINT_FILE}.corrupt-*")
    assert aside.read_bytes() == content, "kept for a person to read"
    claim = bench.claim("after-corruption", bench.device_names()[:2])
    outcome = await bench.dra.prepare([claim])
    assert outcome.ok, outcome.error
    assert claim.uid in recorded_claims(bench.state)
    assert (await bench.dra.unprepare([claim])).ok
    assert len([m for m in messages(plugin, "error") if "checkpoint" in m]) == 1


@pytest.mark.parametrize("tear", ["cut short", "zeros"])
async def test_a_checkpoint_torn_by_a_power_cut_keeps_what_came_before(bench, tear):
    """Without fsync a power cut can cut the journal's last line short or leave zeros in
    its place. The claims recorded before it are still prepared (unprepare finds them and
    removes their specs); the torn change is lost, said once as a warning, and the file is
    whole again after the next change."""
    plugin = await bench.up()
    kept, lost = bench.claim("kept", bench.device_names()[:1]), bench.claim(
        "lost", bench.device_names()[1:2])
    assert (await bench.dra.prepare([kept])).ok
    checkpoint = bench.state / CHECKPOINT_FILE
    before = checkpoint.read_bytes()
    assert (await bench.dra.prepare([lost])).ok
    added = checkpoint.read_bytes()[len(before):]
    assert await plugin.terminate() == 0  # the node lost power; this driver left first
    checkpoint.write_bytes(before + (added[: len(added) // 2] if tear == "cut short"
                                     else b"\0" * len(added)))

    restarted = bench.serve(bench.kubeconfig(), name="restarted")
    await bench.until_alive(restarted, lambda: bench.dra.endpoints(DRIVER), "registered again")
    kept_spec = bench.cdi / recorded_claims(bench.state)[kept.uid].claim_spec
    assert kept_spec.exists()
    assert (await bench.dra.unprepare([kept, lost])).ok
    assert not kept_spec.exists(), "a claim recorded before the tear is still unprepared"
    assert not list(bench.cdi.glob(f"*{lost.uid}*")), "the lost claim's spec goes by its UID"
    warned = [m for m in messages(restarted, "warning") if "damaged line" in m]
    assert len(warned) == 1, messages(restarted, "warning", "error")
    assert not [m for m in messages(restarted, "error") if "checkpoint" in m]
    assert kept.uid not in recorded_claims(bench.state), "the file reads whole again"


# -- 9. a second instance on the node (rolling update) --------------------------------------


async def test_a_second_instance_waits_and_takes_over_without_fighting(bench):
    first = await bench.up()
    start = time.time()
    second = bench.serve(bench.kubeconfig(), name="second")
    await second.wait_for_log(lambda e: "Waiting for it to stop" in e.get("message", ""),
                              what="the newcomer waiting for the socket")
    claim = bench.claim("during-update", bench.device_names()[:2])
    assert (await bench.dra.prepare([claim])).ok, "the first one still serves"
    spec = bench.cdi / recorded_claims(bench.state)[claim.uid].claim_spec
    assert spec.exists()
    await asyncio.sleep(3.0)
    writes = bench.slice_writes(start)
    assert not writes, f"{len(writes)} slice writes while the first one serves"

    assert await first.terminate() == 0
    stopped = time.time()
    await second.wait_for_log(lambda e: "took over" in e.get("message", ""),
                              what="the newcomer taking over")
    await bench.until_alive(second, lambda: bench.dra.endpoints(DRIVER), "registered again")
    await asyncio.sleep(2.0)
    writes = bench.slice_writes(stopped)
    assert len(writes) <= len(bench.slices()), [(r.verb, r.name) for r in writes]
    assert len(bench.device_names()) == 8
    # The claim the first one prepared while the second waited is the second's to undo:
    # its record too, not only its spec.
    assert (await bench.dra.unprepare([claim])).ok
    assert not spec.exists(), "the claim's CDI spec was left behind"
    assert claim.uid not in recorded_claims(bench.state)
    await bench.wipe_is_undone(second)
