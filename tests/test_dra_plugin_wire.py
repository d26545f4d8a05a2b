"""api_versions.dra_plugin: the DRA wire of every served service, to and from driver values."""

from __future__ import annotations

import pytest

from api_versions import dra_plugin, dra_services
from api_versions.dra_plugin import (
    claim_refs,
    health_response,
    plugin_handlers,
    prepare_response,
    registration_handlers,
    unprepare_response,
)
from api_versions.wire import WireApi
from value_types.claims import ClaimRef, ClaimResult, PreparedDevice
from value_types.health import DeviceHealthReport, HealthState

SERVICES = list(dra_services.PLUGIN_SERVICES)
IDS = [s.name for s in SERVICES]
FPGA0 = PreparedDevice("node-1", "fpga-0", "0000:5e:00.0", ("accel/large",),
                       ("b-com.com/accelerator=0000-5e-00.0", "fpga.b-com.com/claim=u1-accel"))
FPGA1 = PreparedDevice("node-1", "fpga-1", "0000:5e:00.1", ("accel/large",),
                       ("b-com.com/accelerator=0000-5e-00.1",))


def refs(*uids):
    return [ClaimRef("ns", f"claim-{u}", u) for u in uids]


class Context:
    def __init__(self, remaining=None):
        self.remaining = remaining
        self.aborted = None

    def time_remaining(self):
        return self.remaining

    async def abort(self, code, details):
        self.aborted = (code, details)
        raise RuntimeError("aborted")


@pytest.mark.parametrize("service", SERVICES, ids=IDS)
def test_claims_are_read_from_every_services_request(service):
    request = service.methods()["NodePrepareResources"].request(claims=[
        {"namespace": "ns", "uid": "u1", "name": "a"}, {"namespace": "other", "uid": "u2",
                                                        "name": "b"}])
    wire_bytes = request.SerializeToString()
    parsed = service.methods()["NodePrepareResources"].request.FromString(wire_bytes)
    assert claim_refs(parsed) == [ClaimRef("ns", "a", "u1"), ClaimRef("other", "b", "u2")]


@pytest.mark.parametrize("service", SERVICES, ids=IDS)
def test_every_claim_asked_gets_an_entry_with_its_devices_or_its_error(service):
    results = {"u1": ClaimResult((FPGA0, FPGA1)), "u2": ClaimResult(error="not allocated")}
    response = prepare_response(service.load(), refs("u1", "u2", "u3"), results)
    decoded = service.methods()["NodePrepareResources"].response.FromString(
        response.SerializeToString())
    assert set(decoded.claims) == {"u1", "u2", "u3"}
    devices = decoded.claims["u1"].devices
    assert [(list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids))
            for d in devices] == [
        (["accel"], "node-1", "fpga-0", list(FPGA0.cdi_ids)),
        (["accel"], "node-1", "fpga-1", list(FPGA1.cdi_ids))]
    assert decoded.claims["u1"].error == ""
    assert decoded.claims["u2"].error == "not allocated" and not decoded.claims["u2"].devices
    assert decoded.claims["u3"].error == "claim ns/claim-u3 (u3): the driver gave no answer"
    if service is dra_services.V1:
        assert not devices[0].HasField("share_id"), "a device held whole has no share ID"


SHARE = "5f0c2a9e-3b1d-4c7e-8a6f-2d9e1b7c4a30"


@pytest.mark.parametrize("service", SERVICES, ids=IDS)
def test_a_share_carries_its_share_id_where_the_service_has_the_field(service):
    share = PreparedDevice("node-1", "fpga-0", "0000:5e:00.0", ("accel",),
                           ("b-com.com/accelerator=0000-5e-00.0",), SHARE, 2)
    response = prepare_response(service.load(), refs("u1"),
                                {"u1": ClaimResult((share, FPGA1))})
    decoded = service.methods()["NodePrepareResources"].response.FromString(
        response.SerializeToString())
    shared, whole = decoded.claims["u1"].devices
    assert (shared.device_name, whole.device_name) == ("fpga-0", "fpga-1")
    if service is dra_services.V1:
        assert shared.HasField("share_id") and shared.share_id == SHARE
        assert not whole.HasField("share_id"), "set exactly for shares"
    else:
        assert "share_id" not in shared.DESCRIPTOR.fields_by_name


def test_a_prepared_claim_with_no_device_still_has_an_entry():
    wire = dra_services.V1.load()
    response = prepare_response(wire, refs("u1"), {"u1": ClaimResult(())})
    decoded = type(response).FromString(response.SerializeToString())
    assert "u1" in decoded.claims and decoded.claims["u1"].error == ""


def test_a_very_long_error_is_cut():
    wire = dra_services.V1.load()
    response = prepare_response(wire, refs("u1"), {"u1": ClaimResult(error="x" * 10_000)})
    assert len(response.claims["u1"].error) == dra_plugin.MAX_ERROR
    assert response.claims["u1"].error.endswith("...")


@pytest.mark.parametrize("service", SERVICES, ids=IDS)
def test_unprepare_answers_every_claim(service):
    response = unprepare_response(service.load(), refs("u1", "u2", "u3"),
                                  {"u1": "", "u2": "checkpoint read-only"})
    decoded = service.methods()["NodeUnprepareResources"].response.FromString(
        response.SerializeToString())
    assert {uid: e.error for uid, e in decoded.claims.items()} == {
        "u1": "", "u2": "checkpoint read-only",
        "u3": "claim ns/claim-u3 (u3): the driver gave no answer"}


def test_health_goes_out_with_every_field_the_newest_kubelet_reads():
    response = health_response([
        DeviceHealthReport("node-1", "fpga-0", HealthState.HEALTHY, 1700000000, 30),
        DeviceHealthReport("node-1", "fpga-1", HealthState.UNHEALTHY, 1700000001, 30,
                           "port error"),
        DeviceHealthReport("node-1", "fpga-2", HealthState.UNKNOWN, 1700000002, 30,
                           "discovery stalled")])
    decoded = type(response).FromString(response.SerializeToString())
    assert [(d.device.pool_name, d.device.device_name, d.health, d.last_updated_time,
             d.health_check_timeout_seconds, d.message) for d in decoded.devices] == [
        ("node-1", "fpga-0", 1, 1700000000, 30, ""),
        ("node-1", "fpga-1", 2, 1700000001, 30, "port error"),
        ("node-1", "fpga-2", 0, 1700000002, 30, "discovery stalled")]


@pytest.mark.parametrize("service", dra_services.HEALTH_SERVICES, ids=lambda s: s.name)
def test_health_goes_out_as_the_message_of_the_service_streamed(service):
    response = health_response([DeviceHealthReport("node-1", "fpga-0", HealthState.UNHEALTHY,
                                                    1700000000, 30, "port error")], service)
    assert response.DESCRIPTOR.full_name == f"{service.load().package}.NodeWatchResourcesResponse"
    decoded = service.load().message("NodeWatchResourcesResponse").FromString(
        response.SerializeToString())
    assert decoded.devices[0].message == "port error" and decoded.devices[0].health == 2


def test_handlers_cover_every_advertised_claim_service_and_health_only_when_given():
    class Backend:
        async def prepare(self, claims, timeout=None):
            return {}

        async def unprepare(self, claims, timeout=None):
            return {}

    without = plugin_handlers(Backend())
    expected = {m.path for s in SERVICES for m in s.methods().values()}
    assert set(without) == expected
    assert "/v1alpha3.Node/NodePrepareResources" in without, "1.31's service"

    async def health():
        yield []

    with_health = plugin_handlers(Backend(), health)
    assert set(with_health) - expected == {"/v1alpha1.DRAResourceHealth/NodeWatchResources",
                                           "/v1.DRAResourceHealth/NodeWatchResources"}


class Failing:
    def __init__(self):
        self.timeouts = []

    async def prepare(self, claims, timeout=None):
        self.timeouts.append(timeout)
        raise RuntimeError("a driver bug")

    async def unprepare(self, claims, timeout=None):
        raise RuntimeError("another bug")


@pytest.mark.parametrize("service", SERVICES, ids=IDS)
async def test_a_driver_failure_becomes_every_claims_error_never_a_status(service):
    backend = Failing()
    seen = []
    handlers = plugin_handlers(backend, on_call=lambda s, m: seen.append((s.name, m)))
    methods = service.methods()
    prepare = handlers[methods["NodePrepareResources"].path].unary_unary
    request = methods["NodePrepareResources"].request(claims=[{"namespace": "ns", "uid": "u1",
                                                               "name": "a"}])
    response = await prepare(request, Context(remaining=45.0))
    assert response.claims["u1"].error == ("claim ns/a (u1): internal error of the driver: "
                                           "RuntimeError: a driver bug")
    assert backend.timeouts == [45.0 - dra_plugin.ANSWER_MARGIN]
    unprepare = handlers[methods["NodeUnprepareResources"].path].unary_unary
    response = await unprepare(methods["NodeUnprepareResources"].request(
        claims=[{"namespace": "ns", "uid": "u1", "name": "a"}]), Context())
    assert response.claims["u1"].error.endswith("RuntimeError: another bug")
    assert seen == [(service.name, "NodePrepareResources"),
                    (service.name, "NodeUnprepareResources")]


@pytest.mark.parametrize(("remaining", "expected"), [
    (None, dra_plugin.KUBELET_CALL_TIMEOUT - dra_plugin.ANSWER_MARGIN),
    (45.0, 45.0 - dra_plugin.ANSWER_MARGIN), (4.0, 2.0)])
def test_the_answer_is_due_before_the_kubelets_deadline(remaining, expected):
    assert dra_plugin.answer_within(Context(remaining)) == pytest.approx(expected)


async def test_registration_says_dra_plugin_this_socket_and_every_service():
    infos, statuses = [], []
    handlers = registration_handlers("fpga.b-com.com", lambda: infos.append(1), statuses.append)
    wire = WireApi.load("pluginregistration")
    get_info = handlers["/pluginregistration.Registration/GetInfo"].unary_unary
    info = await get_info(wire.new("InfoRequest"), Context())
    assert (info.type, info.name, info.endpoint) == ("DRAPlugin", "fpga.b-com.com", "")
    assert tuple(info.supported_versions) == dra_services.SUPPORTED_VERSIONS
    notify = handlers["/pluginregistration.Registration/NotifyRegistrationStatus"].unary_unary
    await notify(wire.new("RegistrationStatus", plugin_registered=False, error="no"), Context())
    assert infos == [1] and [(s.registered, s.error) for s in statuses] == [(False, "no")]
