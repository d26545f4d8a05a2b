"""Claim device status (KEP-4817) from the real ``serve --api dra``.

Between the emulated 1.36 API server and kubelet of ``dra_bench``: after the kubelet's
NodePrepareResources the claim's ``status.devices`` names each prepared port (PCI address,
device nodes, CDI devices) with a ``Ready`` condition; a port turning unhealthy turns it False
with the health reason, and back; a refused (403) or hanging status write never touches the
kubelet's answer, is said once, counted, and retried until it goes through.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from compat_tests.apiserver import DEFAULT_USER
from compat_tests.apiserver.client import ApiClient
from compat_tests.dra_bench import DRIVER, NAMESPACE, NODE, Bench, messages, port_device
from compat_tests.fake_sysfs import CRASHED_AFU_ID, DEFAULT_AFU_ID
from compat_tests.kubelet.dra_results import ClaimRef
from compat_tests.test_dra_auto import Scraper, key

OTHER_DRIVER = "gpu.example.com"
APPLY = "application/apply-patch+yaml"


@pytest.fixture
def bench(dra_bench: Bench) -> Bench:
    """One node of emulated Kubernetes and a fake FPGA tree (compat_tests/conftest.py)."""
    return dra_bench


def entries(bench: Bench, name: str) -> dict[str, dict[str, Any]]:
    """The claim's ``status.devices`` by device name (every driver's)."""
    claim = bench.api.get("resourceclaims", name, NAMESPACE) or {}
    return {d["device"]: d for d in claim.get("status", {}).get("devices", [])}


def ready(entry: dict[str, Any] | None) -> dict[str, Any]:
    conditions = {c["type"]: c for c in (entry or {}).get("conditions", [])}
    return conditions.get("Ready", {})


def status_writes(bench: Bench, since: float = 0.0) -> list[Any]:
    return [r for r in bench.api.requests if r.resource == "resourceclaims"
            and r.subresource == "status" and r.verb == "patch" and r.time >= since]


async def prepared(bench: Bench, name: str, devices: list[str]) -> ClaimRef:
    claim = bench.claim(name, devices)
    outcome = await bench.dra.prepare([claim])
    assert outcome.ok, outcome.error
    return claim


async def test_prepare_writes_each_port_with_its_pci_address_and_ready_true(bench):
    plugin = await bench.up()
    _, first = port_device(bench, "5e", 0)
    _, second = port_device(bench, "af", 1)
    # A claim that also holds another driver's device, whose entry that driver wrote.
    bench.api.create_claim(NAMESPACE, "two-drivers")
    results = [{"request": "req-0", "driver": d, "pool": p, "device": n}
               for d, p, n in ((DRIVER, NODE, first), (DRIVER, NODE, second),
                               (OTHER_DRIVER, "gpus", "gpu-0"))]
    theirs = {"driver": OTHER_DRIVER, "pool": "gpus", "device": "gpu-0",
              "conditions": [{"type": "Ready", "status": "True", "reason": "Attached",
                              "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    obj = bench.api.set_claim_status(NAMESPACE, "two-drivers", {
        "allocation": {"devices": {"results": results}}, "devices": [theirs]})
    outcome = await bench.dra.prepare([ClaimRef(NAMESPACE, "two-drivers",
                                                obj["metadata"]["uid"], (DRIVER,))])
    assert outcome.ok, outcome.error

    await bench.until_alive(plugin, lambda: {first, second} <= set(entries(bench, "two-drivers")),
                            "both ports in the claim's status.devices")
    found = entries(bench, "two-drivers")
    assert found["gpu-0"] == theirs, "another driver's entry is left as it was"
    entry = found[first]
    assert (entry["driver"], entry["pool"]) == (DRIVER, NODE)
    assert entry["data"]["pciAddress"] == "0000:5e:00.0", entry
    assert entry["data"]["deviceNodes"], entry
    assert entry["data"]["cdiDevices"], entry
    assert found[second]["data"]["pciAddress"] == "0000:af:00.0", found[second]
    condition = ready(entry)
    assert (condition["status"], condition["reason"]) == ("True", "Prepared"), entry
    assert condition["lastTransitionTime"].endswith("Z")
    writes = status_writes(bench)
    assert writes and all(w.query.get("fieldManager") == DRIVER for w in writes), writes
    assert all(w.query.get("force") == "true" and w.status == 200 for w in writes), writes
    assert bench.api.validate(bench.api.get("resourceclaims", "two-drivers", NAMESPACE)) == []

    # The kubelet asking again (its restart) costs no second write of the same entries.
    count = len(status_writes(bench))
    assert (await bench.dra.prepare([ClaimRef(NAMESPACE, "two-drivers",
                                              obj["metadata"]["uid"], (DRIVER,))])).ok
    await asyncio.sleep(0.5)
    assert len(status_writes(bench)) == count


async def test_a_port_turning_unhealthy_turns_ready_false_with_the_reason_and_back(bench):
    plugin = await bench.up()
    port, name = port_device(bench, "86", 1)
    await prepared(bench, "crashing", [name])
    await bench.until_alive(plugin, lambda: ready(entries(bench, "crashing").get(name))
                            .get("status") == "True", "Ready True after prepare")

    bench.fake.set_afu_id(port, CRASHED_AFU_ID)
    await bench.until_alive(plugin, lambda: ready(entries(bench, "crashing").get(name))
                            .get("status") == "False", "Ready False once the AFU crashed")
    condition = ready(entries(bench, "crashing")[name])
    assert condition["reason"] == "DeviceUnhealthy", condition
    assert "AFU ID is all f: firmware crashed" in condition["message"], condition
    assert entries(bench, "crashing")[name]["data"]["afuID"] == CRASHED_AFU_ID

    bench.fake.set_afu_id(port, DEFAULT_AFU_ID)
    await bench.until_alive(plugin, lambda: ready(entries(bench, "crashing").get(name))
                            .get("status") == "True", "Ready True again once mended")
    assert ready(entries(bench, "crashing")[name])["reason"] == "Prepared"

    # Unprepared: the driver stops following it (the server drops the entries at
    # deallocation); a later crash writes nothing more.
    claim = ClaimRef(NAMESPACE, "crashing",
                     bench.api.get("resourceclaims", "crashing", NAMESPACE)["metadata"]["uid"],
                     (DRIVER,))
    assert (await bench.dra.unprepare([claim])).ok
    since = time.time()
    bench.fake.set_afu_id(port, CRASHED_AFU_ID)
    await bench.until_alive(plugin, lambda: bench.tainted(name), "the crash published")
    await asyncio.sleep(0.5)
    assert not status_writes(bench, since)



async def test_a_crash_while_the_plugin_was_down_is_written_by_the_next_one(bench):
    """The next process reads the claims from its checkpoint and writes their status once:
    the kubelet does not call prepare again for pods that kept running."""
    first = await bench.up()
    port, name = port_device(bench, "3b", 1)
    await prepared(bench, "across-restart", [name])
    await bench.until_alive(first, lambda: ready(entries(bench, "across-restart").get(name))
                            .get("status") == "True", "Ready True after prepare")
    assert await first.terminate() == 0
    bench.fake.set_afu_id(port, CRASHED_AFU_ID)
    second = bench.serve(bench.kubeconfig(), name="second")
    await bench.until_alive(second, lambda: ready(entries(bench, "across-restart").get(name))
                            .get("status") == "False", "the crash written by the next process")
    assert "firmware crashed" in ready(entries(bench, "across-restart")[name])["message"]

async def test_a_refused_status_write_never_fails_prepare_and_is_retried(bench):
    await bench.start_api()
    await bench.start_kubelet()
    plugin = bench.serve(bench.kubeconfig(), extra=[
        "--metrics-port", str(Scraper.free_port()), "--metrics-address", "127.0.0.1"])
    await bench.published(plugin)
    metrics = await Scraper.of(plugin)
    # 1.36 granular authorization: the service account lacks the resourceclaims/driver rule.
    bench.api.faults.deny("associated-node:patch", "resourceclaims/driver")
    names = bench.device_names()
    await prepared(bench, "refused-a", [names[0]])
    await prepared(bench, "refused-b", [names[1]])

    await plugin.wait_for_log(lambda e: e.get("level") == "warning"
                              and "device status" in e.get("message", ""),
                              what="the refusal said")
    await bench.until_alive(plugin, lambda: sum(w.status == 403 for w in status_writes(bench))
                            >= 4, "refused writes retried")
    said = [m for m in messages(plugin, "warning") if "device status" in m]
    assert len(said) == 1, said
    assert "associated-node:patch" in said[0] and "resourceclaims/driver" in said[0], said
    assert DEFAULT_USER in said[0], said
    scraped = metrics.samples()
    assert scraped.get(key("dra_claim_status_writes_total__result=refused"), 0) >= 4, scraped
    assert key("dra_claim_status_writes_total__result=ok") not in scraped
    assert not entries(bench, "refused-a")

    bench.api.faults.allow("associated-node:patch", "resourceclaims/driver")
    await bench.until_alive(plugin, lambda: names[0] in entries(bench, "refused-a")
                            and names[1] in entries(bench, "refused-b"),
                            "written once RBAC allows it", timeout=45.0)
    assert ready(entries(bench, "refused-a")[names[0]])["status"] == "True"
    await metrics.until("writes counted", **{"dra_claim_status_writes_total__result=ok": 2})
    await plugin.wait_for_log(lambda e: "written again" in e.get("message", ""),
                              what="the recovery said")
    assert plugin.alive


async def test_a_hanging_status_write_does_not_delay_prepare(bench):
    """The write hangs for longer than the test lives and the driver's own request timeout
    is as long: a prepare that waited on it could not answer at all, let alone ok."""
    await bench.start_api()
    await bench.start_kubelet()
    plugin = bench.serve(bench.kubeconfig(), extra=["--api-request-timeout", "300"])
    await bench.published(plugin)
    bench.api.faults.slow_down("patch", "resourceclaims", 300.0)
    names = bench.device_names()
    claim = bench.claim("hanging", [names[2]])
    outcome = await bench.dra.prepare([claim])
    assert outcome.ok, outcome.error
    await bench.until_alive(plugin, lambda: status_writes(bench), "the status write sent")
    assert all(w.status is None for w in status_writes(bench)), "still hanging"

    # Other claims are prepared and unprepared meanwhile.
    other = bench.claim("meanwhile", [names[3]])
    assert (await bench.dra.prepare([other])).ok
    assert (await bench.dra.unprepare([other])).ok
    assert all(w.status is None for w in status_writes(bench)), "no write has got through"
    assert plugin.alive


async def test_the_emulated_server_applies_per_manager_and_checks_the_rules(bench):
    """The emulator's side: apply keeps other managers' entries, refuses what upstream
    validation refuses, and a 1.35 server has no granular check."""
    api = await bench.start_api()
    api.create_allocated_claim(NAMESPACE, "c", driver=DRIVER, pool=NODE,
                               devices=["dev-a", "dev-b"], node_name=NODE)
    path = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims/c/status"

    def body(*devices: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": "c", "namespace": NAMESPACE},
                "status": {"devices": list(devices)}}

    def dev(name: str, **extra: Any) -> dict[str, Any]:
        return {"driver": DRIVER, "pool": NODE, "device": name, **extra}

    async with ApiClient(api.url, api.token, api.ca_file) as client:
        async def apply(doc: dict[str, Any], manager: str, force: bool = True) -> Any:
            return await client.request(
                "PATCH", path, body=doc, content_type=APPLY,
                params={"fieldManager": manager, **({"force": "true"} if force else {})})

        assert (await apply(body(dev("dev-a")), "one")).status == 200
        assert (await apply(body(dev("dev-b")), "two")).status == 200
        assert set(entries(bench, "c")) == {"dev-a", "dev-b"}
        assert (await apply(body(), "one")).status == 200, "one takes its entry back"
        assert set(entries(bench, "c")) == {"dev-b"}
        conflict = await apply(body(dev("dev-b", data={"x": 1})), "one", force=False)
        assert conflict.status == 409, conflict.body
        bad = await apply(body(dev("dev-c"), dev("dev-a", conditions=[
            {"type": "Ready", "status": "Maybe", "reason": "not camel"}])), "one")
        text = bad.message
        assert bad.status == 422, text
        for expected in ("must be an allocated device in the claim",
                         "conditions[0].status: Unsupported value",
                         "conditions[0].lastTransitionTime: Required value",
                         "conditions[0].reason: Invalid value"):
            assert expected in text, (expected, text)
        many = [{"type": f"T{i}", "status": "True", "reason": "R",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"} for i in range(9)]
        too_many = await apply(body(dev("dev-a", conditions=many)), "one")
        assert too_many.status == 422 and "Too many" in too_many.message, too_many.body
        big = await apply(body(dev("dev-a", data={"x": "y" * 10240})), "one")
        assert big.status == 422 and "Too long" in big.message, big.body

        api.faults.deny("associated-node:patch", f"resourceclaims/driver/{DRIVER}")
        refused = await apply(body(dev("dev-a")), "one")
        assert refused.status == 403 and "associated-node:patch" in refused.message, \
            refused.body
        assert (await apply(body(), "one")).status == 200, "touching no entry needs no rule"


async def test_a_1_35_server_has_no_granular_status_check(bench):
    """DRAResourceClaimGranularStatusAuthorization arrives (beta, on) in 1.36: before it,
    resourceclaims/status alone lets a driver write status.devices."""
    api = await bench.start_api("1.35")
    api.create_allocated_claim(NAMESPACE, "c", driver=DRIVER, pool=NODE, devices=["dev-a"],
                               node_name=NODE)
    api.faults.deny("associated-node:patch", "resourceclaims/driver")
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": NAMESPACE},
            "status": {"devices": [{"driver": DRIVER, "pool": NODE, "device": "dev-a"}]}}
    async with ApiClient(api.url, api.token, api.ca_file) as client:
        reply = await client.request(
            "PATCH", f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims/c/status",
            body=body, content_type=APPLY, params={"fieldManager": DRIVER, "force": "true"})
    assert reply.status == 200, reply.body
    assert set(entries(bench, "c")) == {"dev-a"}
