"""A claim's status.devices entries: the apply configuration and the writer's rules."""

from __future__ import annotations

import asyncio
import logging

import pytest

from api_versions.claim_status import MAX_DATA, status_apply
from compat_tests.apiserver import validate
from compat_tests.dra_support import until
from plugin.serving.dra.apiserver import ApiRefused, ApiUnavailable, NotFound
from plugin.serving.dra.claim_status import ClaimStatusReporter
from plugin.serving.dra.prepared import PreparedClaim
from value_types.claims import ClaimRef, DeviceCondition, DeviceStatusReport, PreparedDevice
from value_types.devices import Device, DeviceNode, DeviceSet, Health

DRIVER = "accelerator.b-com.com"
REF = ClaimRef("ns", "claim", "4f1d2a36-5b8e-4c3e-9d8f-0a1b2c3d4e5f")
READY = DeviceCondition("Ready", "True", "Prepared", "ok", "2026-01-01T00:00:00Z")


def report(device: str = "pci-0000-5e-00-0", **changes: object) -> DeviceStatusReport:
    values: dict[str, object] = {"driver": DRIVER, "pool": "node-a", "device": device,
                                 "data": (("pciAddress", "0000:5e:00.0"),),
                                 "conditions": (READY,)}
    values.update(changes)
    return DeviceStatusReport(**values)  # type: ignore[arg-type]


def test_the_apply_configuration_is_a_claim_with_this_drivers_entries_only():
    body = status_apply("v1", REF, [report()])
    assert body == {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "claim", "namespace": "ns", "uid": REF.uid},
        "status": {"devices": [{
            "driver": DRIVER, "pool": "node-a", "device": "pci-0000-5e-00-0",
            "conditions": [{"type": "Ready", "status": "True", "reason": "Prepared",
                            "message": "ok", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
            "data": {"pciAddress": "0000:5e:00.0"}}]}}
    for version in ("v1", "v1beta2", "v1beta1"):  # the 1.36 schemas accept it as is
        assert validate(status_apply(version, REF, [report()]), version) == []


@pytest.mark.parametrize(("changes", "problem"), [
    ({"conditions": tuple(DeviceCondition(f"T{i}", "True", "R", "", "t") for i in range(9))},
     "9 conditions, at most 8"),
    ({"conditions": (DeviceCondition("Ready", "Maybe", "R", "", "t"),)}, "status 'Maybe'"),
    ({"conditions": (DeviceCondition("Ready", "True", "not camel", "", "t"),)},
     "is not CamelCase"),
    ({"conditions": (DeviceCondition("Ready", "True", "R", "", ""),)}, "no lastTransitionTime"),
    ({"data": (("x", "y" * MAX_DATA),)}, "data larger than 10240 bytes"),
])
def test_what_the_server_would_refuse_is_refused_before_sending(changes, problem):
    with pytest.raises(ValueError, match=problem):
        status_apply("v1", REF, [report(**changes)])


def test_a_device_twice_or_not_allocated_is_refused():
    with pytest.raises(ValueError, match="a device twice"):
        status_apply("v1", REF, [report(), report()])
    with pytest.raises(ValueError, match="not a device of the claim's allocation"):
        status_apply("v1", REF, [report()], allocated=[(DRIVER, "node-a", "other", None)])


# -- the writer ---------------------------------------------------------------------------------


def device(healthy: bool = True) -> Device:
    return Device("0000:5e:00.0", "intel",
                  health=Health.HEALTHY if healthy else Health.UNHEALTHY,
                  health_reason="" if healthy else "AFU ID is all f: firmware crashed",
                  nodes=(DeviceNode("/dev/dfl-port.0", "/dev/dfl-port.0"),),
                  attributes=(("pci_address", "0000:5e:00.0"),))


CLAIM = PreparedClaim(REF, (PreparedDevice("node-a", "pci-0000-5e-00-0", "0000:5e:00.0",
                                           ("req",), ("b-com.com/accelerator=x",)),), None)


class Server:
    """The writes a reporter makes, failing as told."""

    def __init__(self, failures: list[Exception] | None = None) -> None:
        self.failures = list(failures or [])
        self.written: list[tuple[DeviceStatusReport, ...]] = []
        self.attempts = 0

    async def write(self, ref: ClaimRef, reports: tuple[DeviceStatusReport, ...]) -> None:
        self.attempts += 1
        if self.failures:
            raise self.failures.pop(0)
        self.written.append(reports)




async def test_refusals_are_said_once_retried_and_prepare_never_waits(caplog):
    devices = [DeviceSet.of([device()])]
    server = Server([ApiRefused("403 Forbidden: no", 403)] * 3 + [ApiUnavailable("down", 503)])
    reporter = ClaimStatusReporter(DRIVER, lambda: devices[0], server.write,
                                   backoff_initial=0.01, backoff_max=0.02)
    with caplog.at_level(logging.INFO, "plugin.serving.dra.claim_status"):
        reporter.prepared([CLAIM])  # returns at once: the writes run on their own
        assert server.attempts == 0
        await until(lambda: server.written, "written after the refusals")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings  # one per kind of failure: 403, then 503
    assert "associated-node:patch on resourceclaims/driver for resourceNames " \
        f"[{DRIVER}]" in warnings[0]
    assert any("written again" in r.getMessage() for r in caplog.records)
    (entry,) = server.written[0]
    assert entry.conditions[0].status == "True"
    assert dict(entry.data)["deviceNodes"] == ("/dev/dfl-port.0",)

    # Health changes write again; the transition time moves with the status only.
    devices[0] = DeviceSet.of([device(healthy=False)])
    reporter.devices_changed()
    await until(lambda: len(server.written) == 2, "unhealthy written")
    (entry,) = server.written[1]
    assert (entry.conditions[0].status, entry.conditions[0].reason) == ("False",
                                                                        "DeviceUnhealthy")
    assert entry.conditions[0].message == "AFU ID is all f: firmware crashed"
    reporter.devices_changed()  # nothing changed: nothing written
    await asyncio.sleep(0.05)
    assert len(server.written) == 2
    await reporter.close()


async def test_a_claim_gone_or_unprepared_is_given_up():
    devices = DeviceSet.of([device()])
    server = Server([NotFound("gone")])
    reporter = ClaimStatusReporter(DRIVER, lambda: devices, server.write,
                                   backoff_initial=0.01, backoff_max=0.02)
    reporter.prepared([CLAIM])
    await until(lambda: server.attempts == 1 and reporter.pending == 0, "given up")
    await asyncio.sleep(0.05)
    assert server.attempts == 1

    server = Server([ApiUnavailable("down", 503)] * 1000)
    reporter = ClaimStatusReporter(DRIVER, lambda: devices, server.write,
                                   backoff_initial=0.01, backoff_max=0.02)
    reporter.prepared([CLAIM])
    await until(lambda: server.attempts >= 2, "retrying")
    reporter.unprepared([REF.uid])
    await asyncio.sleep(0.01)
    attempts = server.attempts
    await asyncio.sleep(0.1)
    assert server.attempts == attempts and reporter.pending == 0
    await reporter.close()
