"""Shares of one device (KEP-5075 consumable capacity) as the emulated 1.36 scheduler hands them
out, on slices shaped as the driver publishes a shared FPGA (a ``contexts`` capacity with a
request policy), through the emulated API server's validation; and what a 1.35 server, with
the gate off, leaves of the same objects."""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

import pytest

from compat_tests import cel_devices
from compat_tests.apiserver import ApiServerEmulator, objects
from compat_tests.apiserver.allocate import AllocationError, allocate_claim
from compat_tests.apiserver.capacity import consumed, violates_policy
from compat_tests.apiserver.errors import ApiError
from plugin.cli import config

DRIVER = config.DEFAULT_DRA_DRIVER
NODE = "fpga-node-1"
NAMESPACE = "default"
CLASS = "shared-fpga.example.com"
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
Obj = dict[str, Any]


def contexts_policy(count: int) -> Obj:
    """The request policy the driver publishes: 1 by default, 1 .. N by 1."""
    return {"default": "1", "validRange": {"min": "1", "max": str(count), "step": "1"}}


def shared(name: str, count: int = 4, policy: Obj | None = None) -> Obj:
    device = objects.device(name, {"afuID": "d8424dc4a4a3c413f89e433683f9040b"})
    device["allowMultipleAllocations"] = True
    device["capacity"] = {"contexts": {"value": str(count),
                                       "requestPolicy": policy or contexts_policy(count)}}
    return device


def whole(name: str, contexts: int | None = None) -> Obj:
    return objects.device(name, {"afuID": "d8424dc4a4a3c413f89e433683f9040b"},
                          capacity={"contexts": str(contexts)} if contexts else None)


def publish(api: ApiServerEmulator, devices: list[Obj], generation: int = 1) -> None:
    """The node's pool at ``generation`` (a newer one replaces what the scheduler sees)."""
    if api.get("nodes", NODE) is None:
        api.create_node(NODE)
    api.create(objects.resource_slice(f"{NODE}-{generation}", driver=DRIVER, node_name=NODE,
                                      devices=devices, generation=generation))


def make_api(model: str = "1.36") -> ApiServerEmulator:
    api = ApiServerEmulator(model)
    api.create(objects.device_class(CLASS, driver=DRIVER))
    return api


def ask(api: ApiServerEmulator, name: str, contexts: str | None = None,
        requests: tuple[str, ...] = ("req-0",)) -> Obj:
    """Create a claim whose requests each ask ``contexts`` (nothing named when None)."""
    claim = objects.claim(NAMESPACE, name, [(r, CLASS) for r in requests])
    if contexts is not None:
        for request in claim["spec"]["devices"]["requests"]:
            request["exactly"]["capacity"] = {"requests": {"contexts": contexts}}
    return api.create(claim)


def results(claim: Obj) -> list[Obj]:
    found: list[Obj] = claim["status"]["allocation"]["devices"]["results"]
    return found


def unallocated(api: ApiServerEmulator, name: str) -> bool:
    claim = api.get("resourceclaims", name, NAMESPACE)
    return claim is not None and "allocation" not in (claim.get("status") or {})


# --- shares of one device -------------------------------------------------------------------


def test_three_claims_share_four_contexts_and_a_fourth_is_refused():
    api = make_api()
    publish(api, [shared("fpga-0", 4)])
    shares = []
    for name, contexts in (("one", "1"), ("two", "1"), ("three", "2")):
        ask(api, name, contexts)
        (result,) = results(allocate_claim(api, NAMESPACE, name, NODE))
        assert result["device"] == "fpga-0" and result["pool"] == NODE
        assert UUID.fullmatch(result["shareID"])
        assert result["consumedCapacity"] == {"contexts": contexts}
        shares.append(result["shareID"])
    assert len(set(shares)) == 3
    # The stored claims carry what the scheduler wrote (the status write validated).
    assert results(api.get("resourceclaims", "three", NAMESPACE))[0]["shareID"] == shares[2]
    ask(api, "fourth")  # names no capacity: the policy's default, 1 context
    with pytest.raises(AllocationError, match=r"cannot allocate all claims: .*0 of 1 devices"):
        allocate_claim(api, NAMESPACE, "fourth", NODE)
    assert unallocated(api, "fourth")


def test_a_claim_asking_more_contexts_than_the_device_has_is_not_allocated():
    api = make_api()
    publish(api, [shared("fpga-0", 4)])
    ask(api, "greedy", "5")
    with pytest.raises(AllocationError, match=r"capacity asked left \(contexts: 5\)"):
        allocate_claim(api, NAMESPACE, "greedy", NODE)
    assert unallocated(api, "greedy")
    # Nothing was taken: the whole device is still there for 4.
    ask(api, "all-four", "4")
    assert results(allocate_claim(api, NAMESPACE, "all-four", NODE))[0]["consumedCapacity"] == {
        "contexts": "4"}


def test_what_is_left_decides_not_what_the_device_has():
    api = make_api()
    publish(api, [shared("fpga-0", 4)])
    ask(api, "three", "3")
    allocate_claim(api, NAMESPACE, "three", NODE)
    ask(api, "two", "2")
    with pytest.raises(AllocationError, match="cannot allocate all claims"):
        allocate_claim(api, NAMESPACE, "two", NODE)
    ask(api, "one", "1")
    assert results(allocate_claim(api, NAMESPACE, "one", NODE))[0]["device"] == "fpga-0"


def test_two_requests_of_one_claim_get_two_shares_of_one_device():
    api = make_api()
    publish(api, [shared("fpga-0", 4)])
    ask(api, "pair", "2", requests=("a", "b"))
    first, second = results(allocate_claim(api, NAMESPACE, "pair", NODE))
    assert (first["request"], second["request"]) == ("a", "b")
    assert first["device"] == second["device"] == "fpga-0"
    assert first["shareID"] != second["shareID"]


def test_shares_spread_to_the_next_device_when_one_is_full():
    api = make_api()
    publish(api, [shared("fpga-0", 2), shared("fpga-1", 2)])
    placed = []
    for index in range(4):
        ask(api, f"c{index}", "1")
        placed.append(results(allocate_claim(api, NAMESPACE, f"c{index}", NODE))[0]["device"])
    assert placed == ["fpga-0", "fpga-0", "fpga-1", "fpga-1"]


def test_consumed_capacity_lists_every_capacity_of_the_device_even_at_zero():
    device = shared("fpga-0", 4)
    device["capacity"]["bandwidth"] = {"value": "10", "requestPolicy": {
        "default": "0", "validRange": {"min": "0", "max": "10", "step": "1"}}}
    api = make_api()
    publish(api, [device])
    ask(api, "share", "1")
    (result,) = results(allocate_claim(api, NAMESPACE, "share", NODE))
    assert result["consumedCapacity"] == {"contexts": "1", "bandwidth": "0"}

def test_a_capacity_the_device_does_not_have_does_not_match():
    api = make_api()
    publish(api, [shared("fpga-0", 4)])
    claim = objects.claim(NAMESPACE, "other", [("req-0", CLASS)])
    claim["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = {
        "requests": {"memory": "1Gi"}}
    api.create(claim)
    with pytest.raises(AllocationError, match=r"memory: 1Gi"):
        allocate_claim(api, NAMESPACE, "other", NODE)


# --- request policies -----------------------------------------------------------------------


def test_a_step_rounds_up_from_the_minimum():
    policy = {"default": "1", "validRange": {"min": "1", "max": "7", "step": "2"}}
    api = make_api()
    publish(api, [shared("fpga-0", 8, policy)])
    ask(api, "two", "2")  # the grid is 1, 3, 5, 7
    assert results(allocate_claim(api, NAMESPACE, "two", NODE))[0]["consumedCapacity"] == {
        "contexts": "3"}
    ask(api, "none", "0")  # below the minimum: the minimum
    assert results(allocate_claim(api, NAMESPACE, "none", NODE))[0]["consumedCapacity"] == {
        "contexts": "1"}
    ask(api, "eight", "8")  # rounds to 9, over the maximum: the device does not fit
    with pytest.raises(AllocationError, match="cannot allocate all claims"):
        allocate_claim(api, NAMESPACE, "eight", NODE)


def test_valid_values_round_up_to_the_next_one():
    policy = {"default": "1", "validValues": ["1", "2", "4"]}
    api = make_api()
    publish(api, [shared("fpga-0", 8, policy)])
    ask(api, "three", "3")
    assert results(allocate_claim(api, NAMESPACE, "three", NODE))[0]["consumedCapacity"] == {
        "contexts": "4"}
    ask(api, "five", "5")  # above every valid value
    with pytest.raises(AllocationError, match="cannot allocate all claims"):
        allocate_claim(api, NAMESPACE, "five", NODE)


def test_consumed_amounts_follow_the_upstream_rules():
    value = {"value": "4"}
    assert consumed(None, value) == (4, "4")  # no policy, not named: the whole capacity
    assert consumed("3", value) == (3, "3")  # no policy, named: as asked
    ranged = {"value": "8Gi", "requestPolicy": {"default": "2Gi", "validRange": {
        "min": "2Gi", "step": "1Gi"}}}
    assert consumed(None, ranged) == (2 * 2**30, "2Gi")
    assert consumed("2500Mi", ranged) == (3 * 2**30, "3Gi")  # the step grid, binary
    assert consumed("1", ranged) == (2 * 2**30, "2Gi")  # below the minimum: the minimum
    no_step = {"value": "8", "requestPolicy": {"default": "2", "validRange": {"min": "2"}}}
    assert consumed("5", no_step) == (5, "5")  # no step: as asked once over the minimum
    stepped = {"default": "1", "validRange": {"min": "1", "max": "7", "step": "2"}}
    assert not violates_policy(Fraction(5), stepped)
    assert violates_policy(Fraction(4), stepped) and violates_policy(Fraction(9), stepped)
    assert violates_policy(Fraction(3), {"validValues": ["1", "2"]})


# --- whole and shared never together --------------------------------------------------------


def test_a_device_held_whole_gives_no_share_after_it_is_published_shared():
    api = make_api()
    publish(api, [whole("fpga-0")])
    ask(api, "owner")
    (result,) = results(allocate_claim(api, NAMESPACE, "owner", NODE))
    assert "shareID" not in result and "consumedCapacity" not in result
    publish(api, [shared("fpga-0", 4)], generation=2)
    ask(api, "share", "1")
    with pytest.raises(AllocationError, match="cannot allocate all claims"):
        allocate_claim(api, NAMESPACE, "share", NODE)


def test_a_device_shares_hold_is_not_given_whole_while_it_publishes_its_contexts():
    api = make_api()
    publish(api, [shared("fpga-0", 4)])
    ask(api, "share", "1")
    allocate_claim(api, NAMESPACE, "share", NODE)
    # Published whole again, with its contexts and no policy: a claim naming none takes all
    # four, which do not fit beside the share's one.
    publish(api, [whole("fpga-0", contexts=4)], generation=2)
    ask(api, "owner")
    with pytest.raises(AllocationError, match="cannot allocate all claims"):
        allocate_claim(api, NAMESPACE, "owner", NODE)
    ask(api, "small", "3")  # asked explicitly, 3 fit beside the share: given whole
    (result,) = results(allocate_claim(api, NAMESPACE, "small", NODE))
    assert "shareID" not in result


def test_the_scheduler_does_not_keep_shares_off_a_device_republished_without_capacity():
    """Upstream's tracker counts shares only as capacity: a device published whole without
    any capacity while shares hold it is handed out whole. Only the driver can refuse that
    (at prepare), which is why it never flips a device to whole under its shares."""
    api = make_api()
    publish(api, [shared("fpga-0", 4)])
    ask(api, "share", "1")
    allocate_claim(api, NAMESPACE, "share", NODE)
    publish(api, [whole("fpga-0")], generation=2)
    ask(api, "owner")
    (result,) = results(allocate_claim(api, NAMESPACE, "owner", NODE))
    assert result["device"] == "fpga-0" and "shareID" not in result


def test_a_device_not_shared_is_filtered_by_its_capacity_and_given_whole():
    api = make_api()
    publish(api, [whole("fpga-0", contexts=4)])
    ask(api, "five", "5")
    with pytest.raises(AllocationError, match="cannot allocate all claims"):
        allocate_claim(api, NAMESPACE, "five", NODE)
    ask(api, "two", "2")
    (result,) = results(allocate_claim(api, NAMESPACE, "two", NODE))
    assert "shareID" not in result and "consumedCapacity" not in result
    ask(api, "again", "1")  # whole: nothing left for anyone
    with pytest.raises(AllocationError, match="cannot allocate all claims"):
        allocate_claim(api, NAMESPACE, "again", NODE)


# --- selectors ------------------------------------------------------------------------------


def test_selectors_see_allow_multiple_allocations():
    expression = "device.allowMultipleAllocations"
    assert cel_devices.evaluate(expression, shared("fpga-0"), DRIVER) is True
    assert cel_devices.evaluate(expression, whole("fpga-1"), DRIVER) is False
    with pytest.raises(cel_devices.CelRuntimeError):
        cel_devices.evaluate(expression, shared("fpga-0"), DRIVER, consumable_capacity=False)


def test_a_class_selecting_shared_devices_skips_whole_ones():
    api = ApiServerEmulator("1.36")
    api.create(objects.device_class(CLASS, driver=DRIVER, spec={"selectors": [
        {"cel": {"expression": "device.allowMultipleAllocations"}}]}))
    publish(api, [whole("fpga-0"), shared("fpga-1")])
    ask(api, "share", "1")
    assert results(allocate_claim(api, NAMESPACE, "share", NODE))[0]["device"] == "fpga-1"


# --- the API server's side ------------------------------------------------------------------


def test_device_status_entries_name_the_share_they_report():
    api = make_api()
    publish(api, [shared("fpga-0", 4)])
    ask(api, "share", "1")
    status = allocate_claim(api, NAMESPACE, "share", NODE)["status"]
    share = results({"status": status})[0]["shareID"]
    entry = {"driver": DRIVER, "pool": NODE, "device": "fpga-0"}
    for wrong in (entry, {**entry, "shareID": "00000000-0000-4000-8000-000000000000"}):
        with pytest.raises(ApiError, match="must be an allocated device in the claim"):
            api.set_claim_status(NAMESPACE, "share", {**status, "devices": [wrong]})
    stored = api.set_claim_status(NAMESPACE, "share",
                                  {**status, "devices": [{**entry, "shareID": share}]})
    assert stored["status"]["devices"] == [{**entry, "shareID": share}]


def test_a_malformed_share_id_or_consumed_capacity_is_refused():
    api = make_api()
    publish(api, [shared("fpga-0", 4)])
    ask(api, "share", "1")
    result = objects.result("req-0", DRIVER, NODE, "fpga-0", shareID="Not-A-UUID",
                            consumedCapacity={"contexts": "1"})
    allocation = objects.allocation([result], node_name=NODE)
    with pytest.raises(ApiError, match="shareID"):
        api.set_claim_status(NAMESPACE, "share", {"allocation": allocation})
    result.update(shareID="6f1d1a8e-3b5c-4c1e-9f8a-2d7e4b6a0c11", consumedCapacity={
        "contexts": "one"})
    with pytest.raises(ApiError, match="consumedCapacity"):
        api.set_claim_status(NAMESPACE, "share", {"allocation": allocation})
    assert unallocated(api, "share")


def test_a_1_35_server_drops_the_fields_and_the_device_is_whole():
    api = make_api("1.35")
    publish(api, [shared("fpga-0", 4)])
    (slice_obj,) = api.list("resourceslices")
    (device,) = slice_obj["spec"]["devices"]
    assert "allowMultipleAllocations" not in device
    assert device["capacity"] == {"contexts": {"value": "4"}}
    created = ask(api, "first", "1")
    assert "capacity" not in created["spec"]["devices"]["requests"][0]["exactly"]
    (result,) = results(allocate_claim(api, NAMESPACE, "first", NODE))
    assert "shareID" not in result and "consumedCapacity" not in result
    ask(api, "second", "1")
    with pytest.raises(AllocationError, match="cannot allocate all claims"):
        allocate_claim(api, NAMESPACE, "second", NODE)


def test_a_1_35_server_drops_a_share_a_client_writes():
    api = make_api("1.35")
    publish(api, [whole("fpga-0")])
    ask(api, "claim")
    result = objects.result("req-0", DRIVER, NODE, "fpga-0",
                            shareID="6f1d1a8e-3b5c-4c1e-9f8a-2d7e4b6a0c11",
                            consumedCapacity={"contexts": "1"})
    entry = {"driver": DRIVER, "pool": NODE, "device": "fpga-0", "shareID": result["shareID"]}
    stored = api.set_claim_status(NAMESPACE, "claim", {
        "allocation": objects.allocation([result], node_name=NODE), "devices": [entry]})
    assert results(stored) == [{"request": "req-0", "driver": DRIVER, "pool": NODE,
                                "device": "fpga-0"}]
    assert stored["status"]["devices"] == [{"driver": DRIVER, "pool": NODE, "device": "fpga-0"}]


def test_a_1_36_server_keeps_the_fields():
    api = make_api()
    publish(api, [shared("fpga-0", 4)])
    (slice_obj,) = api.list("resourceslices")
    assert slice_obj["spec"]["devices"][0]["allowMultipleAllocations"] is True
    created = ask(api, "first", "2")
    assert created["spec"]["devices"]["requests"][0]["exactly"]["capacity"] == {
        "requests": {"contexts": "2"}}


@pytest.mark.parametrize("version", ["v1beta1", "v1beta2"])
def test_a_share_reads_the_same_in_the_older_versions(version):
    """A driver reading claims in v1beta1 or v1beta2 sees the same share: the request's
    capacity (flat in v1beta1) and the result's shareID and consumedCapacity."""
    api = make_api()
    api.switch_model("1.36", runtime_config="resource.k8s.io/v1beta1=true,"
                                            "resource.k8s.io/v1beta2=true")
    publish(api, [shared("fpga-0", 4)])
    ask(api, "share", "2")
    (written,) = results(allocate_claim(api, NAMESPACE, "share", NODE))
    claim = api.get("resourceclaims", "share", NAMESPACE, version=version)
    (request,) = claim["spec"]["devices"]["requests"]
    asked = request if version == "v1beta1" else request["exactly"]
    assert asked["capacity"] == {"requests": {"contexts": "2"}}
    (result,) = results(claim)
    assert (result["shareID"], result["consumedCapacity"]) == (
        written["shareID"], {"contexts": "2"})
