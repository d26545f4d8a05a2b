"""``serve --programming on --program-at bind``: functions loaded while the scheduler waits.

The real process, an emulated 1.36 API server and kubelet, the stand-in vendor tools, and
the emulated 1.36 scheduler's PreBind (:mod:`compat_tests.apiserver.scheduler`, with a short
poll and timeout): a claim allocated on a programmable device waits on the driver's
``FunctionReady``; a failed load sets ``FunctionFailed`` and the scheduler allocates again,
elsewhere, as the 1.36 dynamicresources plugin does.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from compat_tests.apiserver import ApiServerEmulator, objects
from compat_tests.apiserver.allocate import allocate_claim
from compat_tests.apiserver.scheduler import BindingScheduler
from compat_tests.dra_support import until
from compat_tests.fake_fpga_tools import write_stand_in_tools
from compat_tests.fpga_images import NLB3_AFU_ID as NLB3
from compat_tests.kubelet.dra_results import ClaimRef
from compat_tests.test_dra_programming_serve import DFL_PORT, DRIVER, NAMESPACE, NODE, World
from compat_tests.test_dra_programming_serve import running as programming_world

READY = f"{DRIVER}/FunctionReady"
FAILED = f"{DRIVER}/FunctionFailed"
INTEL = "intel-nlb3"


def nlb3_class(api: ApiServerEmulator) -> None:
    """A class of the Intel ports whose configuration names NLB3 (copied into allocations)."""
    api.create_device_class(INTEL, driver=DRIVER, spec={
        "selectors": [{"cel": {"expression": f'device.attributes["{DRIVER}"].family == '
                                             '"intel"'}}],
        "config": [{"opaque": {"driver": DRIVER, "parameters": {
            "apiVersion": f"{DRIVER}/v1alpha1", "kind": "FpgaFunction", "afuID": NLB3,
            "image": "intel/nlb3.gbs"}}}]})


@pytest.fixture
async def binding(tmp_path: Path, sockdir: Path, logdir: Path) -> AsyncIterator[World]:
    async for w in programming_world(tmp_path, sockdir, logdir, "--program-at", "bind"):
        nlb3_class(w.api)
        yield w


def devices(world: World) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in world.api.list("resourceslices")
            if s["spec"]["nodeName"] == NODE for d in s["spec"].get("devices", [])}


def conditions(world: World, claim: str) -> dict[str, dict[str, Any]]:
    obj = world.api.get("resourceclaims", claim, NAMESPACE) or {}
    return {c["type"]: c for entry in obj.get("status", {}).get("devices", [])
            for c in entry.get("conditions", [])}


def bdf(device_name: str) -> str:
    """``pci-0000-5e-00-0`` -> ``0000:5e:00.0``."""
    domain, bus, dev, fn = device_name.removeprefix("pci-").split("-")[:4]
    return f"{domain}:{bus}:{dev}.{fn}"


async def test_programmable_devices_carry_the_binding_conditions(binding: World) -> None:
    published = devices(binding)
    programmable = [n for n, d in published.items()
                    if d["attributes"]["programmable"]["bool"]]
    assert programmable
    for name, device in published.items():
        if name in programmable:
            assert device["bindingConditions"] == [READY]
            assert device["bindingFailureConditions"] == [FAILED]
        else:
            assert "bindingConditions" not in device


async def test_prepare_mode_publishes_no_binding_condition(world: World) -> None:
    assert not any("bindingConditions" in d for d in devices(world).values())


async def test_a_pod_whose_first_card_fails_to_load_runs_on_a_second_card(
        binding: World, tmp_path: Path) -> None:
    world = binding
    intel = [n for n, d in devices(world).items()
             if d["attributes"]["family"]["string"] == "intel"]
    assert len(intel) == 2
    first = sorted(intel)[0]  # the emulated allocator takes slices' devices in order
    write_stand_in_tools(tmp_path / "tools", world.node, fail_at=(bdf(first),))
    world.api.create_claim(NAMESPACE, "job", [("fpga", INTEL)])
    scheduler = BindingScheduler(world.api, poll=0.2, binding_timeout=30.0)
    outcome = await scheduler.schedule(NAMESPACE, "job-pod", "job", NODE)
    assert outcome.bound, outcome.errors
    assert outcome.attempts == 2 and outcome.devices[0] == first
    assert outcome.devices[1] != first
    assert "binding failed" in outcome.errors[0] and "PR failed: timeout" in outcome.errors[0]
    ready = conditions(world, "job")[READY]
    assert ready["status"] == "True" and ready["reason"] == "Loaded"
    # The failed card is tainted (its state is unknown), so it was not picked again.
    assert devices(world)[first]["taints"][0]["effect"] == "NoSchedule"
    reasons = [e["reason"] for e in world.api.list("events", NAMESPACE)]
    assert "BindingConditionsPending" in reasons and "FunctionLoadFailed" in reasons
    # The kubelet's prepare finds the function loaded: no load at prepare.
    claim = world.api.get("resourceclaims", "job", NAMESPACE)
    assert claim is not None
    result = await world.prepare(ClaimRef(NAMESPACE, "job", claim["metadata"]["uid"],
                                          (DRIVER,)))
    assert result.ok, result.error
    assert len(world.tools.invocations("fpgaconf")) == 2


async def test_a_claim_that_needs_no_function_is_ready_at_once(binding: World) -> None:
    world = binding
    world.api.create_claim(NAMESPACE, "plain", [("fpga", DRIVER)])
    outcome = await BindingScheduler(world.api, poll=0.2, binding_timeout=30.0).schedule(
        NAMESPACE, "plain-pod", "plain", NODE)
    assert outcome.bound and outcome.attempts == 1, outcome.errors
    assert conditions(world, "plain")[READY]["reason"] == "NoFunctionNeeded"
    assert world.tools.invocations() == []


async def test_a_claim_deallocated_while_its_load_runs_is_abandoned(
        binding: World, tmp_path: Path) -> None:
    world = binding
    write_stand_in_tools(tmp_path / "tools", world.node, delay=2.0)
    world.api.create_claim(NAMESPACE, "gone", [("fpga", INTEL)])
    stored = allocate_claim(world.api, NAMESPACE, "gone", NODE)
    device = stored["status"]["allocation"]["devices"]["results"][0]["device"]
    await until(lambda: world.tools.invocations("fpgaconf"), "the load started")
    world.api.set_claim_status(NAMESPACE, "gone", {})  # the scheduler gave it up
    await world.plugin.wait_for_log(lambda e: "deallocated or deleted while" in
                                    e.get("message", ""), what="the load abandoned")
    assert READY not in conditions(world, "gone")
    # The device is not held for the claim that is gone: another claim of it is answered.
    world.api.create_claim(NAMESPACE, "next", [("fpga", DRIVER)])
    world.api.set_claim_status(NAMESPACE, "next", {"allocation": objects.allocation(
        [objects.result("fpga", DRIVER, NODE, device, bindingConditions=[READY],
                        bindingFailureConditions=[FAILED])], node_name=NODE)})
    await until(lambda: READY in conditions(world, "next"), "the next claim answered")
    assert conditions(world, "next")[READY]["status"] == "True"


async def test_two_claims_on_one_card_at_once_never_interleave(binding: World) -> None:
    world = binding
    results = [objects.result("fpga", DRIVER, NODE, DFL_PORT, bindingConditions=[READY],
                              bindingFailureConditions=[FAILED])]
    config = [{"source": "FromClass", "requests": ["fpga"], "opaque": {
        "driver": DRIVER, "parameters": {"apiVersion": f"{DRIVER}/v1alpha1",
                                         "kind": "FpgaFunction", "afuID": NLB3,
                                         "image": "intel/nlb3.gbs"}}}]
    for name in ("a", "b"):
        world.api.create_claim(NAMESPACE, name, [("fpga", DRIVER)])
    for name in ("a", "b"):
        world.api.set_claim_status(NAMESPACE, name, {"allocation": objects.allocation(
            results, node_name=NODE, config=config if name == "a" else ())})
    await until(lambda: all(conditions(world, n) for n in ("a", "b")), "both answered")
    answers = sorted(next(iter(conditions(world, n))) for n in ("a", "b"))
    # One is given its function; the other is refused (the device is held for the first),
    # never loaded over it.
    assert answers == [FAILED, READY], answers
    assert len(world.tools.invocations("fpgaconf")) <= 1


@pytest.fixture
async def world(tmp_path: Path, sockdir: Path, logdir: Path) -> AsyncIterator[World]:
    async for w in programming_world(tmp_path, sockdir, logdir):
        yield w


async def test_a_server_without_the_gate_drops_them_and_loads_at_prepare(
        tmp_path: Path, sockdir: Path, logdir: Path) -> None:
    async for world in programming_world(tmp_path, sockdir, logdir, "--program-at", "bind",
                                         api_server=lambda: ApiServerEmulator("1.35")):
        await world.plugin.wait_for_log(
            lambda e: "dropped bindingConditions" in e.get("message", ""), what="the warning")
        assert not any("bindingConditions" in d for d in devices(world).values())
        ref = world.claim("nlb3", DFL_PORT, {
            "source": "FromClass", "requests": ["fpga"], "opaque": {
                "driver": DRIVER, "parameters": {"apiVersion": f"{DRIVER}/v1alpha1",
                                                 "kind": "FpgaFunction", "afuID": NLB3,
                                                 "image": "intel/nlb3.gbs"}}})
        result = await world.prepare(ref)
        assert result.ok, result.error
        assert len(world.tools.invocations("fpgaconf")) == 1
        assert world.plugin.text().count("dropped bindingConditions") == 1

