"""The emulated kubelet DRA manager behaves like the kubelet of each release, checked with a
fake DRA plugin over real unix sockets.

Driver tests will trust this emulator to be a faithful kubelet; these pin down what it does
from the plugin's side of the socket: which path each release calls for the same
``supported_versions``, the refusals the plugin is sent, the calls for claims and what is
made of their answers, the health stream, slice wiping and restarts.
"""

from __future__ import annotations

import asyncio

import pytest

from api_versions import dra_services
from compat_tests.fake_dra_plugin import FakeDevice, registered
from compat_tests.kubelet.dra_models import highest_supported_version, load_dra_model
from compat_tests.kubelet.dra_results import ClaimRef

DRIVER = "fpga.example.com"
V1_PREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"
V1BETA1_PREPARE = "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources"
V1ALPHA4_PREPARE = "/v1alpha3.Node/NodePrepareResources"


def claim(uid, name=None, drivers=(DRIVER,)):
    return ClaimRef("default", name or f"claim-{uid}", uid, tuple(drivers))


# -- service selection ---------------------------------------------------------------------------

@pytest.mark.parametrize(("model", "service", "path"), [
    ("1.31", "v1alpha3.NodeService", V1ALPHA4_PREPARE),
    ("1.32", "v1beta1.DRAPlugin", V1BETA1_PREPARE),
    ("1.33", "v1beta1.DRAPlugin", V1BETA1_PREPARE),
    ("1.34", "v1.DRAPlugin", V1_PREPARE),
    ("1.36", "v1.DRAPlugin", V1_PREPARE),
    ("1.37", "v1.DRAPlugin", V1_PREPARE),
])
async def test_each_release_calls_its_service_for_the_advertised_list(
        dra_node, model, service, path):
    kubelet = await dra_node(model, enabled=True)
    plugin = await dra_node.plugin(
        supported_versions=dra_services.SUPPORTED_VERSIONS,
        devices={"u1": (FakeDevice("pool", "fpga-0", ("req",), ("example.com/fpga=0",)),)})
    assert await registered(kubelet, plugin) == (True, "")
    assert kubelet.dra.service(DRIVER) == service
    outcome = await kubelet.dra.prepare([claim("u1")])
    assert outcome.ok, outcome.error
    assert plugin.calls == [(path, ("u1",))]
    assert outcome.cdi_ids("u1") == ("example.com/fpga=0",)
    assert outcome.calls[0].path == path


@pytest.mark.parametrize(("model", "offered", "picked"), [
    ("1.32", ("v1.DRAPlugin",), "v1alpha3.NodeService"),  # no known entry: v1alpha4 anyway
    ("1.33", ("v1alpha3.NodeService", "v1beta1.DRAPlugin"), "v1beta1.DRAPlugin"),  # own order
    ("1.34", ("v1beta1.DRAPlugin", "v1.DRAPlugin"), "v1beta1.DRAPlugin"),  # plugin's order
    ("1.34", ("v1alpha3.NodeService", "v1.DRAPlugin"), "v1.DRAPlugin"),  # unknown skipped
])
def test_who_decides_the_order(model, offered, picked):
    assert load_dra_model(model).choose(DRIVER, offered).service == picked


async def test_1_34_refuses_a_list_without_a_service_it_knows(dra_node):
    kubelet = await dra_node("1.34")
    plugin = await dra_node.plugin(supported_versions=("v1alpha3.NodeService", "1.0.0"))
    registered_, error = await registered(kubelet, plugin)
    assert not registered_
    assert error == (
        "RegisterPlugin error -- plugin validation failed with err: invalid supported gRPC "
        f"versions of DRA driver plugin {DRIVER} at endpoint {plugin.socket_path}: none of "
        'services supported by the plugin (["v1alpha3.NodeService" "1.0.0"]) are supported '
        'by the kubelet (["v1.DRAPlugin" "v1beta1.DRAPlugin"])')
    assert kubelet.dra.endpoints(DRIVER) == ()
    assert [r.accepted for r in kubelet.dra.registrations][:1] == [False]
    # Refused registrations are tried again with the plugin manager's backoff.
    await registered(kubelet, plugin, 2)


@pytest.mark.parametrize(("model", "wording"), [
    ("1.33", f"invalid versions of plugin {DRIVER}: "),
    ("1.36", f"invalid supported gRPC versions of DRA driver plugin {DRIVER} at endpoint {{}}: "),
])
async def test_an_empty_list_is_refused(dra_node, model, wording):
    kubelet = await dra_node(model, enabled=True)
    plugin = await dra_node.plugin(supported_versions=())
    _, error = await registered(kubelet, plugin)
    assert error == ("RegisterPlugin error -- plugin validation failed with err: "
                     + wording.format(plugin.socket_path)
                     + "empty list of supported gRPC services (aka supported versions)")


async def test_1_31_reads_versions_as_semver_and_skips_service_strings(dra_node):
    kubelet = await dra_node("1.31", enabled=True)
    plugin = await dra_node.plugin(supported_versions=("v1.DRAPlugin", "v1beta1.DRAPlugin"))
    _, error = await registered(kubelet, plugin)
    assert error == (
        "RegisterPlugin error -- plugin validation failed with err: validating DRA plugin "
        f'"{DRIVER}": none of the versions specified ["v1.DRAPlugin" "v1beta1.DRAPlugin"] are '
        "supported: could not find a highest supported version from versions "
        '([v1.DRAPlugin v1beta1.DRAPlugin]) reported: illegal version string "v1.DRAPlugin"')


def test_go_semver_rules_of_1_31():
    assert highest_supported_version(("v1.DRAPlugin", "1.0.0", "2.0.0", "1.2")) == (1, 2)
    with pytest.raises(ValueError, match=r"must be v1.x"):
        highest_supported_version(("0.3.0",))
    with pytest.raises(ValueError, match=r'could not parse "DRAPlugin" as version'):
        highest_supported_version(("DRAPlugin",))


# -- registration ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("model", "knobs"), [("1.33", {}), ("1.34", {"enabled": False})])
async def test_a_kubelet_without_dra_refuses_the_plugin_type(dra_node, model, knobs):
    kubelet = await dra_node(model, **knobs)
    plugin = await dra_node.plugin()
    assert kubelet.dra is None
    assert await registered(kubelet, plugin) == (
        False, "RegisterPlugin error -- no handler registered for plugin type: DRAPlugin at "
               f"socket {plugin.socket_path}")
    assert kubelet.watcher.outcomes[0].type == "DRAPlugin"


async def test_empty_endpoint_means_the_registration_socket_and_a_named_one_is_used(
        dra_node, sockdir):
    kubelet = await dra_node("1.34")
    same = await dra_node.plugin(driver="a.example.com")
    own = await dra_node.plugin(driver="b.example.com",
                                endpoint=sockdir / "plugins" / "b" / "d.sock")
    await registered(kubelet, same)
    await registered(kubelet, own)
    assert kubelet.dra.endpoints("a.example.com") == (str(same.socket_path),)
    assert kubelet.dra.endpoints("b.example.com") == (str(own.endpoint),)


async def test_hidden_sockets_in_the_registry_are_ignored(dra_node):
    kubelet = await dra_node("1.34")
    hidden = await dra_node.plugin(socket_name=".hidden.sock")
    await asyncio.sleep(0.3)
    assert hidden.info_calls == 0 and kubelet.watcher.get_info_calls == 0


@pytest.mark.parametrize(("model", "second_ok", "endpoints"), [
    ("1.31", False, 1),  # same semver: refused while the first lives
    ("1.32", True, 1),   # newest replaces
    ("1.33", True, 2),   # rolling update: both kept
])
async def test_a_second_instance_of_one_driver(dra_node, sockdir, model, second_ok, endpoints):
    kubelet = await dra_node(model, enabled=True)
    first = await dra_node.plugin(endpoint=sockdir / "p1" / "dra.sock", socket_name="one.sock")
    await registered(kubelet, first)
    second = await dra_node.plugin(endpoint=sockdir / "p2" / "dra.sock", socket_name="two.sock")
    ok, error = await registered(kubelet, second)
    assert ok is second_ok, error
    assert len(kubelet.dra.endpoints(DRIVER)) == endpoints
    if model == "1.31":
        assert error.endswith('already registered with a higher supported version: '
                              '"1.0.0" < "1.0.0"')


async def test_the_same_endpoint_twice_is_refused(dra_node, sockdir):
    kubelet = await dra_node("1.34")
    shared = sockdir / "p" / "dra.sock"
    first = await dra_node.plugin(endpoint=shared, socket_name="one.sock")
    await registered(kubelet, first)
    second = await dra_node.plugin(endpoint=shared, bind_endpoint=False, socket_name="two.sock")
    ok, error = await registered(kubelet, second)
    assert not ok
    assert error == ("RegisterPlugin error -- plugin registration failed with err: endpoint "
                     f"{shared} already registered for DRA driver plugin {DRIVER}")
    assert kubelet.dra.endpoints(DRIVER) == (str(shared),)


async def test_a_vanished_socket_deregisters_and_wipes_the_drivers_slices_later(dra_node):
    wiped: list[tuple[str, str]] = []

    async def wipe_driver(node_name, driver):
        wiped.append((node_name, driver))

    kubelet = await dra_node("1.34", wipe_driver_slices=wipe_driver, driver_wipe_delay=0.2)
    plugin = await dra_node.plugin()
    await registered(kubelet, plugin)
    plugin.remove_registration_socket()
    await kubelet.dra.wait_until(lambda: kubelet.dra.deregistrations, what="deregistration")
    assert kubelet.dra.endpoints(DRIVER) == ()
    outcome = await kubelet.dra.prepare([claim("u1")])
    assert outcome.error == f"prepare dynamic resources: DRA driver {DRIVER} is not registered"
    assert plugin.calls == []
    await kubelet.dra.wait_until(lambda: wiped, what="driver slices wiped")
    assert wiped == [("node-1", DRIVER)]


@pytest.mark.parametrize(("model", "left"), [("1.32", 0), ("1.33", 1)])
async def test_a_replaced_instance_going_away(dra_node, sockdir, model, left):
    """1.32 deregisters by driver name, so the old socket vanishing drops the new instance
    too; 1.33+ remove only the instance of that socket."""
    kubelet = await dra_node(model, enabled=True)
    first = await dra_node.plugin(endpoint=sockdir / "p1" / "dra.sock", socket_name="one.sock")
    await registered(kubelet, first)
    second = await dra_node.plugin(endpoint=sockdir / "p2" / "dra.sock", socket_name="two.sock")
    await registered(kubelet, second)
    first.remove_registration_socket()
    await kubelet.dra.wait_until(lambda: kubelet.dra.deregistrations, what="deregistration")
    assert kubelet.dra.endpoints(DRIVER) == (str(second.endpoint),) * left
