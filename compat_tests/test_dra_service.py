"""The DRA node service against the emulated kubelet DRA manager of each release, in-process.

Real unix sockets in a real ``plugins_registry``, the real :class:`DraNodeService` with its
preparer, checkpoint, claim CDI specs and health broadcaster; only the API server's claims
are a table. Each test asserts what a kubelet of that release would hold: the service it
picked, the devices and CDI IDs of each claim, the error it would put on the pod, the health
it heard.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from api_versions.dra_services import SUPPORTED_VERSIONS
from api_versions.watcher import RegistrationOutcome
from compat_tests.conftest import FAST_DRA
from compat_tests.kubelet import ClaimRef, DraConfig, PreparedDevice
from plugin.model.feed import DeviceFeed
from plugin.serving.dra.checkpoint import ClaimCheckpoint
from plugin.serving.dra.claim_cdi import ClaimSpecs, accelerator_env
from plugin.serving.dra.health import HealthBroadcaster
from plugin.serving.dra.prepare import ClaimPreparer
from plugin.serving.dra.service import DraNodeService, ServiceTiming
from plugin.serving.routing import identity
from tests.dra_fakes import DRIVER, NAMES, PCI, POOL, FakeClaims, allocation, cdi_ids
from value_types.devices import Device, DeviceSet, Health

FAST = ServiceTiming(check_interval=0.2, holder_poll=0.05, retry=0.1)
V1, V1BETA1, V1ALPHA4 = "v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha3.NodeService"
PACKAGE = {V1: "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/",
           V1BETA1: "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/",
           V1ALPHA4: "/v1alpha3.Node/"}
RELEASES = [("1.31", V1ALPHA4, {"enabled": True}), ("1.32", V1BETA1, {"enabled": True}),
            ("1.34", V1, {}), ("1.36", V1, {})]


def node_devices(**unhealthy: str) -> DeviceSet:
    return DeviceSet.of(Device(p, "intel", health=Health.UNHEALTHY if p in unhealthy
                               else Health.HEALTHY, health_reason=unhealthy.get(p, ""))
                        for p in PCI)


def kubelet_claim(uid: str, name: str | None = None) -> ClaimRef:
    return ClaimRef("ns", name or f"claim-{uid}", uid, (DRIVER,))


def cdi(pci: str) -> str:
    return f"b-com.com/accelerator={pci.replace(':', '-')}"


class Driver:
    """One node's DRA driver: the state that survives a restart (checkpoint file, CDI dir,
    the API server's claims) and the service of the current instance."""

    def __init__(self, registry: Path, state: Path) -> None:
        self.registry = registry
        self.state = state
        self.api = FakeClaims()
        self.feed = DeviceFeed(node_devices())
        self.cdi_dir = state / "cdi"
        self.services: list[DraNodeService] = []
        self.broadcasters: list[HealthBroadcaster] = []

    def new_service(self, **options: Any) -> DraNodeService:
        specs = ClaimSpecs(self.cdi_dir, DRIVER,
                           lambda ids: accelerator_env(ids, self.feed.current))
        preparer = ClaimPreparer(DRIVER, POOL, lambda: NAMES, self.api, cdi_ids,
                                 ClaimCheckpoint(self.state / "checkpoint.json"),
                                 claim_specs=specs)
        health = HealthBroadcaster(POOL, self.feed, lambda: NAMES, resend_every=1.0)
        self.broadcasters.append(health)
        service = DraNodeService(DRIVER, self.registry, preparer, health,
                                 timing=options.pop("timing", FAST), **options)
        self.services.append(service)
        return service

    async def start(self, **options: Any) -> DraNodeService:
        service = self.new_service(**options)
        await service.start()
        await service.wait_serving(5)
        return service

    def claim_specs(self) -> list[str]:
        return sorted(p.name for p in self.cdi_dir.glob("*.json"))


@pytest.fixture
async def driver(plugins_registry, tmp_path):
    node = Driver(plugins_registry, tmp_path / "state")
    yield node
    for service in reversed(node.services):
        await service.stop()
    for health in node.broadcasters:
        await health.close()


async def registered(kubelet, count: int = 1):
    dra = kubelet.dra
    await dra.wait_until(lambda: len([r for r in dra.registrations if r.accepted]) >= count,
                         what=f"{count} registration(s) of {DRIVER}")
    return [r for r in dra.registrations if r.accepted][count - 1]


# -- every release: registration, prepare, unprepare ----------------------------------------------

@pytest.mark.parametrize("count", [1, 2, 8])
@pytest.mark.parametrize(("model", "service_name", "knobs"), RELEASES,
                         ids=[r[0] for r in RELEASES])
async def test_each_release_registers_prepares_and_unprepares(
        dra_node, driver, model, service_name, knobs, count):
    kubelet = await dra_node(model, **knobs)
    service = await driver.start()
    registration = await registered(kubelet)
    assert (registration.service, registration.endpoint, registration.supported_versions) == (
        service_name, str(service.socket_path), SUPPORTED_VERSIONS)
    await kubelet.dra.wait_until(lambda: service.registration is not None, what="the status")
    assert service.registration == RegistrationOutcome(True, "")

    names = [f"fpga-{i}" for i in range(count)]
    driver.api.add(allocation("u1", *names))
    prepared = await kubelet.dra.prepare([kubelet_claim("u1")])
    assert prepared.ok, prepared.error
    assert prepared.calls[0].path == PACKAGE[service_name] + "NodePrepareResources"
    env = f"{DRIVER}/claim=u1-accel"
    assert prepared.result("u1").devices == tuple(
        PreparedDevice(("accel",), POOL, name, (cdi(PCI[i]), env) if i == 0 else (cdi(PCI[i]),))
        for i, name in enumerate(names))
    assert service.kubelet_service == service_name
    spec = json.loads((driver.cdi_dir / f"{DRIVER}_claim_u1.json").read_text())
    assert spec["devices"][0]["containerEdits"]["env"] == [
        f"ACCELERATOR_DEVICES={','.join(PCI[:count])}",
        f"ACCELERATOR_UNITS={','.join(PCI[:count])}"]

    unprepared = await kubelet.dra.unprepare([kubelet_claim("u1")])
    assert unprepared.ok, unprepared.error
    assert unprepared.calls[0].path == PACKAGE[service_name] + "NodeUnprepareResources"
    assert len(service.preparer.checkpoint) == 0 and driver.claim_specs() == []


async def test_a_bad_claim_fails_its_pod_and_the_good_one_is_prepared(dra_node, driver):
    kubelet = await dra_node("1.34")
    await driver.start()
    await registered(kubelet)
    driver.api.add(allocation("good", "fpga-0"), allocation("bad", "fpga-99"))
    outcome = await kubelet.dra.prepare([kubelet_claim("good"), kubelet_claim("bad")])
    assert outcome.error == (
        "prepare dynamic resources: NodePrepareResources failed for ResourceClaim claim-bad: "
        "claim ns/claim-bad (bad) is allocated devices pool node-1 does not have: fpga-99")
    assert outcome.result("good").ok and outcome.missing == ()
    driver.api.add(allocation("bad", "fpga-1"))  # reallocated: the kubelet's retry succeeds
    assert (await kubelet.dra.prepare([kubelet_claim("good"), kubelet_claim("bad")])).ok


async def test_a_thousand_claims_in_one_call_over_the_socket(dra_node, driver):
    kubelet = await dra_node("1.34")
    service = await driver.start()
    await registered(kubelet)
    for i in range(1000):
        driver.api.add(allocation(f"u{i}", f"fpga-{i % 8}"))
    outcome = await kubelet.dra.prepare([kubelet_claim(f"u{i}") for i in range(1000)])
    assert outcome.ok, outcome.error
    assert len(outcome.calls) == 1 and len(outcome.results) == 1000
    assert outcome.result("u999").devices[0].device_name == "fpga-7"
    assert service.preparer.checkpoint.writes == 1


# -- health -------------------------------------------------------------------------------------

async def test_a_1_36_kubelet_hears_every_devices_health_and_each_change(dra_node, driver):
    kubelet = await dra_node("1.36")
    service = await driver.start()
    await registered(kubelet)
    dra = kubelet.dra
    await dra.wait_until(lambda: len(dra.health(DRIVER)) == 8, what="the health of 8 devices")
    assert {d.health for d in dra.health(DRIVER).values()} == {"Healthy"}
    assert service.health_streams_opened == 1

    await driver.feed.publish(node_devices(**{PCI[3]: "port error register reads 0x4"}))
    await dra.wait_until(lambda: dra.health(DRIVER)[(POOL, "fpga-3")].health == "Unhealthy",
                         what="fpga-3 Unhealthy")
    record = dra.health(DRIVER)[(POOL, "fpga-3")]
    assert (record.message, record.timeout_seconds) == ("port error register reads 0x4", 30)
    assert dra.health(DRIVER)[(POOL, "fpga-2")].health == "Healthy"

    await driver.feed.publish(node_devices())
    await dra.wait_until(lambda: dra.health(DRIVER)[(POOL, "fpga-3")].health == "Healthy",
                         what="fpga-3 Healthy again")


async def test_a_1_35_kubelet_gets_the_same_stream_without_the_fields_it_does_not_know(
        dra_node, driver):
    kubelet = await dra_node("1.35", resource_health=True)
    await driver.feed.publish(node_devices(**{PCI[0]: "AFU ID reads all f"}))
    await driver.start()
    await registered(kubelet)
    dra = kubelet.dra
    await dra.wait_until(lambda: (POOL, "fpga-0") in dra.health(DRIVER), what="health")
    record = dra.health(DRIVER)[(POOL, "fpga-0")]
    assert (record.health, record.timeout_seconds, record.message) == ("Unhealthy", 30, None)


async def test_no_health_stream_where_the_gate_is_off(dra_node, driver):
    kubelet = await dra_node("1.34")
    service = await driver.start()
    await registered(kubelet)
    driver.api.add(allocation("u1", "fpga-0"))
    assert (await kubelet.dra.prepare([kubelet_claim("u1")])).ok
    assert service.health_streams_opened == 0 and kubelet.dra.health_attempts == []


# -- restarts and the socket --------------------------------------------------------------------

async def test_a_restarted_driver_unprepares_from_its_checkpoint(dra_node, driver):
    kubelet = await dra_node("1.34")
    first = await driver.start()
    await registered(kubelet)
    driver.api.add(allocation("u1", "fpga-0", "fpga-1"), allocation("u2", "fpga-2"))
    prepared = await kubelet.dra.prepare([kubelet_claim("u1"), kubelet_claim("u2")])
    assert prepared.ok, prepared.error
    await first.stop()
    assert not first.socket_path.exists()
    await kubelet.dra.wait_until(lambda: not kubelet.dra.endpoints(DRIVER), what="deregistration")

    driver.api.claims.clear()  # deleted from the API server meanwhile
    driver.api.errors["claim-u1"] = ConnectionError("API server unreachable")
    second = await driver.start()
    await registered(kubelet, 2)
    assert len(second.preparer.checkpoint) == 2
    unprepared = await kubelet.dra.unprepare([kubelet_claim("u1")])
    assert unprepared.ok, unprepared.error
    assert list(second.preparer.checkpoint) == ["u2"]
    assert driver.claim_specs() == [f"{DRIVER}_claim_u2.json"]


async def test_a_kubelet_that_lost_its_state_gets_the_same_devices_without_the_api_server(
        dra_node, driver):
    first_kubelet = await dra_node("1.34")
    service = await driver.start()
    await registered(first_kubelet)
    driver.api.add(allocation("u1", "fpga-5"))
    before = await first_kubelet.dra.prepare([kubelet_claim("u1")])
    await first_kubelet.stop()

    driver.api.errors["claim-u1"] = ConnectionError("API server unreachable")
    second_kubelet = await dra_node("1.34", config=DraConfig(**FAST_DRA))  # a fresh checkpoint
    await registered(second_kubelet)
    again = await second_kubelet.dra.prepare([kubelet_claim("u1")])
    assert again.ok and len(again.calls) == 1, "sent again, answered from the checkpoint"
    assert again.result("u1").devices == before.result("u1").devices
    assert driver.api.reads == ["claim-u1"] and service.info_calls == 2


async def test_a_deleted_socket_is_served_again_and_registered_again(dra_node, driver):
    kubelet = await dra_node("1.34")
    service = await driver.start()
    await registered(kubelet)
    service.socket_path.unlink()
    await registered(kubelet, 2)
    assert service.serving and service.socket_path.is_socket()
    driver.api.add(allocation("u1", "fpga-0"))
    assert (await kubelet.dra.prepare([kubelet_claim("u1")])).ok


async def test_a_live_instance_is_never_robbed_of_its_socket(dra_node, driver):
    kubelet = await dra_node("1.34")
    old = await driver.start()
    await registered(kubelet)
    held = old.socket_path.stat().st_ino
    new = driver.new_service()
    await new.start()
    await asyncio.sleep(0.5)
    assert not new.serving and old.socket_path.stat().st_ino == held

    await old.stop()
    await new.wait_serving(5)
    await registered(kubelet, 2)
    driver.api.add(allocation("u1", "fpga-0"))
    assert (await kubelet.dra.prepare([kubelet_claim("u1")])).ok
    assert new.kubelet_service == V1


async def test_a_stop_cancels_the_calls_in_flight(dra_node, driver):
    kubelet = await dra_node("1.34")
    service = await driver.start()
    await registered(kubelet)
    driver.api.add(allocation("u1", "fpga-0"))
    driver.api.hang.add("claim-u1")
    call = asyncio.create_task(kubelet.dra.prepare([kubelet_claim("u1")]))
    await kubelet.dra.wait_until(lambda: driver.api.reads == ["claim-u1"], what="the read")
    await service.stop()
    outcome = await asyncio.wait_for(call, 5)
    assert driver.api.cancelled == ["claim-u1"]
    assert outcome.error is not None and outcome.calls[0].error.startswith("rpc error: code = ")
    assert len(service.preparer.checkpoint) == 0 and driver.claim_specs() == []


async def test_a_kubelet_without_dra_refuses_and_the_driver_says_why(dra_node, driver, caplog):
    kubelet = await dra_node("1.32")  # DynamicResourceAllocation is off by default in 1.32
    service = await driver.start()
    await kubelet.wait_until(lambda: service.registration is not None, what="a status")
    assert service.registration == RegistrationOutcome(
        False, "RegisterPlugin error -- no handler registered for plugin type: DRAPlugin at "
        f"socket {service.socket_path}")
    assert "the kubelet refused the registration: RegisterPlugin error -- no handler" \
        in caplog.text
    assert service.serving, "the driver keeps serving for the kubelet's retries"


async def test_each_kubelet_s_word_is_its_own_even_when_it_comes_first(sockdir, dra_node,
                                                                     driver):
    """``--api auto`` asks what the kubelet running now said. A kubelet that starts registers
    the driver within milliseconds, often before the plugin has looked at it: its word must
    be found then, not waited for again; and the word of a kubelet gone is not the new one's."""
    kubelet_sock = sockdir / "kubelet.sock"
    first = await dra_node("1.32")  # DRA off: refuses
    service = await driver.start(kubelet_instance=lambda: identity(kubelet_sock))
    old = identity(kubelet_sock)
    refused = await service.verdict_of(old, 5)
    assert refused is not None and not refused.registered
    await first.stop()
    second = await dra_node("1.34")
    await registered(second)  # before anyone asks
    new = identity(kubelet_sock)
    assert new != old
    accepted = await service.verdict_of(new, 0.1)
    assert accepted is not None and accepted.registered
    assert await service.verdict_of(old, 0.3) is None, "a kubelet gone says nothing more"


async def test_a_registry_that_cannot_be_used_is_reported_once_then_served(
        sockdir, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="plugin.serving.dra.service")
    registry = sockdir / "registry"
    registry.write_text("a file where the kubelet's directory should be")
    node = Driver(registry, tmp_path / "state")
    service = node.new_service()
    try:
        await service.start()
        await asyncio.sleep(0.5)
        assert not service.serving
        errors = [r.getMessage() for r in caplog.records
                  if r.levelno >= logging.ERROR and "cannot serve" in r.getMessage()]
        assert len(errors) == 1, errors
        registry.unlink()
        await service.wait_serving(5)
        assert service.socket_path.is_socket() and "serving again after" in caplog.text
    finally:
        await service.stop()
        for health in node.broadcasters:
            await health.close()
