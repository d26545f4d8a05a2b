"""The example DeviceClasses (deploy/examples/programming) against pools the driver's own code
publishes, allocated as the scheduler would: a real CEL evaluator picks the devices, the
class's FpgaFunction lands in the claim's allocation, tainted devices are passed over and no
device is given twice."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from api_versions.resource_slices import slices_for, taint_key
from compat_tests import cel_devices
from compat_tests.apiserver import ApiServerEmulator, objects
from compat_tests.apiserver.allocate import (
    EXTENDED_RESOURCE_CLAIM_ANNOTATION,
    AllocationError,
    allocate_claim,
    extended_resource_claim,
    request_mapping,
    tolerated,
)
from compat_tests.fake_alveo import ALVEO_CARDS, add_alveo_card, load_xclbin
from compat_tests.fake_fpga_tools import write_stand_in_tools
from compat_tests.fake_sysfs import OTHER_AFU_ID, FakeNode
from plugin.cli import config
from plugin.cli.config import parse
from plugin.discovery.backends import make_backend
from plugin.programming.setup import why_not_programmable
from plugin.serving.dra.inventory import pool_of
from value_types.devices import DeviceSet
from value_types.pool import Pool

DRIVER = config.DEFAULT_DRA_DRIVER
NODE = "fpga-node-1"
EXAMPLES = Path(__file__).resolve().parents[1] / "deploy" / "examples" / "programming"
NAMESPACE = "default"
WRONG_INTERFACE = "0123456789abcdef0123456789abcdef"
NLB0_PORTS = {"pci-0000-5e-00-0", "pci-0000-d8-00-0"}
"""Programmable ports built for the nlb0 class's FIM interface, holding nlb0."""
OTHER_AFU_PORT = "pci-0000-3b-00-0"
"""Programmable, built for the same interface, holding another AFU."""
VF_PORT = "pci-0000-be-00-1"
"""A virtual function's port (no FME: not programmable) holding nlb0."""


def example_classes() -> dict[str, dict[str, Any]]:
    """The example DeviceClasses by the family their second selector names."""
    found = {}
    for path in EXAMPLES.glob("*.yaml"):
        for obj in yaml.safe_load_all(path.read_text()):
            if obj and obj["kind"] == "DeviceClass":
                family = obj["spec"]["selectors"][1]["cel"]["expression"].split('"')[-2]
                found[family] = obj
    return found


CLASSES = example_classes()
XCLBIN = CLASSES["alveo"]["spec"]["config"][0]["opaque"]["parameters"]["xclbinUUID"]


def build_node(root: Path) -> FakeNode:
    """Two programmable Intel ports holding nlb0, one holding another AFU, one built for
    another FIM, a virtual function's port (no FME) holding nlb0; two Alveo cards, one with
    the example's xclbin loaded; an F1 and an F2 slot."""
    node = FakeNode(root)
    node.add_opae_card("0000:5e:00.0", numa_node=0)
    node.add_dfl_card("0000:d8:00.0", numa_node=1)
    node.add_dfl_card("0000:3b:00.0", afu_id=OTHER_AFU_ID)
    node.add_dfl_card("0000:c0:00.0", interface_id=WRONG_INTERFACE)
    node.add_opae_card("0000:be:00.0", vfs=1)
    node.add_slot("0000:00:0f.0", numa_node=0)
    node.add_f2_slot("0000:34:00.0", numa_node=1)
    for bdf in ALVEO_CARDS[:2]:
        add_alveo_card(node, bdf)
    load_xclbin(node, ALVEO_CARDS[0], XCLBIN)
    return node


def build_pool(root: Path, programming: bool = True, tools: bool = False) -> Pool:
    """The pool serve publishes for the node; ``tools``: XRT's and the AWS SDK's tools are
    on the node (stand-ins), so Alveo cards and AWS slots are programmable too."""
    node = build_node(root / "node")
    args = ["discover", "--programming", "on" if programming else "off",
            "--dev-root", str(node.dev_root)]
    if tools:
        stand_ins = write_stand_in_tools(root / "tools", node)
        args += ["--xbutil", str(stand_ins.xbutil), "--fpga-load-local-image",
                 str(stand_ins.load), "--fpga-describe-local-image", str(stand_ins.describe)]
    why_not = why_not_programmable(parse(args))
    devices = DeviceSet.of(make_backend("auto", node.config()).scan())
    return pool_of(DRIVER, NODE, devices, programmable=lambda d: why_not(d) is None)


def published(pool: Pool) -> list[dict[str, Any]]:
    """The pool's devices as a v1 slice lists them."""
    (slice_obj,) = slices_for("v1", pool, 1, "node-uid", taints=True)
    devices: list[dict[str, Any]] = slice_obj["spec"]["devices"]
    return devices


def selected(device_class: dict[str, Any], devices: list[dict[str, Any]]) -> set[str]:
    selectors = device_class["spec"]["selectors"]
    return {d["name"] for d in devices
            if cel_devices.selectors_match(selectors, d, DRIVER)}


# --- what each example class selects -------------------------------------------------------


def test_nlb0_selects_programmable_ports_of_its_interface_and_ports_holding_it(tmp_path):
    devices = published(build_pool(tmp_path))
    by_name = {d["name"]: d for d in devices}
    # Programmable and built for the interface (whatever it holds now), and the virtual
    # function's port, which cannot be loaded but holds nlb0 already.
    assert by_name[VF_PORT]["attributes"]["programmable"] == {"bool": False}
    assert selected(CLASSES["intel"], devices) == NLB0_PORTS | {OTHER_AFU_PORT, VF_PORT}
    # Another FIM: programmable, but the bitstream was not built for it.
    assert "pci-0000-c0-00-0" not in selected(CLASSES["intel"], devices)
    assert by_name["pci-0000-c0-00-0"]["attributes"]["programmable"] == {"bool": True}


def test_without_programming_nlb0_selects_only_ports_holding_it(tmp_path):
    devices = published(build_pool(tmp_path, programming=False))
    chosen = selected(CLASSES["intel"], devices)
    assert chosen == NLB0_PORTS | {VF_PORT}  # not the port with another AFU, nor c0's
    assert all(d["attributes"]["afuID"]["string"] == "d8424dc4a4a3c413f89e433683f9040b"
               for d in devices if d["name"] in chosen)


def test_the_alveo_class_selects_the_card_holding_its_xclbin(tmp_path):
    devices = published(build_pool(tmp_path))
    # Without xbutil on the node no card is programmable: only the loaded card fits, and
    # the card without an xclbin is a mismatch, not an evaluation error.
    assert selected(CLASSES["alveo"], devices) == {"pci-0000-17-00-1"}
    # With it, both cards of the shell the xclbin was built for.
    loadable = published(build_pool(tmp_path / "tools", tools=True))
    assert selected(CLASSES["alveo"], loadable) == {"pci-0000-17-00-1", "pci-0000-27-00-1"}


def test_the_aws_class_selects_programmable_f1_slots_only(tmp_path):
    devices = published(build_pool(tmp_path))
    # Without the SDK's tools no slot is programmable, so none is selected.
    assert selected(CLASSES["aws"], devices) == set()
    loadable = published(build_pool(tmp_path / "tools", tools=True))
    (f1,) = [d["name"] for d in loadable if d["attributes"].get("platform") == {"string": "f1"}]
    assert selected(CLASSES["aws"], loadable) == {f1}


def test_an_unguarded_lookup_is_an_error_not_a_mismatch(tmp_path):
    """Why the examples guard with `in`: the scheduler aborts on a missing attribute."""
    (alveo_bare,) = [d for d in published(build_pool(tmp_path))
                     if d["name"] == "pci-0000-27-00-1"]
    expression = f'device.attributes["{DRIVER}"].xclbinUUID == "{XCLBIN}"'
    with pytest.raises(cel_devices.CelRuntimeError, match="xclbinUUID"):
        cel_devices.evaluate(expression, alveo_bare, DRIVER)
    guarded = f'"xclbinUUID" in device.attributes["{DRIVER}"] && {expression}'
    assert cel_devices.evaluate(guarded, alveo_bare, DRIVER) is False


# --- taints ---------------------------------------------------------------------------------


def test_tolerations_follow_the_taint_rules():
    taint = {"key": taint_key(DRIVER), "value": "afu-crashed", "effect": "NoSchedule"}
    assert not tolerated([taint], [])
    assert tolerated([taint], [{"operator": "Exists"}])
    assert tolerated([taint], [{"key": taint["key"], "operator": "Exists",
                                "effect": "NoSchedule"}])
    assert tolerated([taint], [{"key": taint["key"], "value": "afu-crashed"}])
    assert not tolerated([taint], [{"key": taint["key"], "value": "other"}])
    assert not tolerated([taint], [{"operator": "Exists", "effect": "NoExecute"}])
    assert tolerated([{**taint, "effect": "None"}], [])


# --- allocation through the emulated API server --------------------------------------------


def publish(api: ApiServerEmulator, pool: Pool) -> None:
    node = api.create_node(NODE)
    for slice_obj in slices_for("v1", pool, 1, node["metadata"]["uid"], taints=True):
        api.create(slice_obj)


def claim_of(name: str, device_class: str, *, count: int = 1,
             selectors: Sequence[str] = (), config: Sequence[dict[str, Any]] = (),
             tolerations: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    obj = objects.claim(NAMESPACE, name, [("req-0", device_class)])
    exact = obj["spec"]["devices"]["requests"][0]["exactly"]
    exact.update(allocationMode="ExactCount", count=count)
    if selectors:
        exact["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    if tolerations:
        exact["tolerations"] = list(tolerations)
    if config:
        obj["spec"]["devices"]["config"] = list(config)
    return obj


@pytest.fixture
def api(tmp_path) -> ApiServerEmulator:
    """An emulated 1.36 server (not listening: driven in-process) with the node's pool and
    the example classes."""
    server = ApiServerEmulator("1.36")
    publish(server, build_pool(tmp_path))
    for device_class in CLASSES.values():
        server.create(copy.deepcopy(device_class))
    return server


def results(claim: dict[str, Any]) -> list[str]:
    return [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]]


def test_the_class_function_lands_in_the_allocation_before_the_claims(api):
    claim_config = {"requests": ["req-0"], "opaque": {"driver": DRIVER, "parameters": {
        "apiVersion": f"{DRIVER}/v1alpha1", "kind": "FpgaFunction",
        "afuID": "d8424dc4a4a3c413f89e433683f9040b", "image": "nlb0-v2.gbs"}}}
    name = CLASSES["intel"]["metadata"]["name"]
    api.create(claim_of("nlb0", name, config=[claim_config]))
    allocated = allocate_claim(api, NAMESPACE, "nlb0", NODE)
    allocation = allocated["status"]["allocation"]
    (result,) = allocation["devices"]["results"]
    assert result["driver"] == DRIVER and result["pool"] == NODE and result["request"] == "req-0"
    assert result["device"] in NLB0_PORTS | {OTHER_AFU_PORT, VF_PORT}
    assert allocation["devices"]["config"] == [
        {"source": "FromClass", "requests": ["req-0"], **CLASSES["intel"]["spec"]["config"][0]},
        {"source": "FromClaim", **claim_config}]
    assert allocation["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"] == [
        {"key": "metadata.name", "operator": "In", "values": [NODE]}]
    # Stored as written: the status write passed the server's validation.
    assert api.get("resourceclaims", "nlb0", NAMESPACE)["status"] == allocated["status"]


def test_no_device_is_given_twice_and_the_last_claim_finds_none(api):
    name = CLASSES["alveo"]["metadata"]["name"]
    api.create(claim_of("first", name))
    api.create(claim_of("second", name))
    assert results(allocate_claim(api, NAMESPACE, "first", NODE)) == ["pci-0000-17-00-1"]
    with pytest.raises(AllocationError, match="0 of 1 devices of class"):
        allocate_claim(api, NAMESPACE, "second", NODE)
    assert "allocation" not in (api.get("resourceclaims", "second", NAMESPACE).get("status")
                                or {})


def test_a_count_gets_that_many_distinct_devices(api):
    """The nlb0 class fits four ports: three to one claim, then one more, then none."""
    name = CLASSES["intel"]["metadata"]["name"]
    api.create(claim_of("three", name, count=3))
    api.create(claim_of("two", name, count=2))
    api.create(claim_of("one", name))
    first = results(allocate_claim(api, NAMESPACE, "three", NODE))
    assert len(set(first)) == 3
    with pytest.raises(AllocationError, match="1 of 2 devices"):
        allocate_claim(api, NAMESPACE, "two", NODE)
    last = results(allocate_claim(api, NAMESPACE, "one", NODE))
    assert set(first) | set(last) == NLB0_PORTS | {OTHER_AFU_PORT, VF_PORT}


def test_tainted_devices_are_passed_over_unless_tolerated(tmp_path):
    pool = build_pool(tmp_path)
    sick = {"pci-0000-17-00-1"}
    devices = tuple(dataclasses.replace(d, healthy=False, health_reason="firewall tripped",
                                        health_code="firewall-tripped")
                    if d.name in sick else d for d in pool.devices)
    api = ApiServerEmulator("1.36")
    publish(api, dataclasses.replace(pool, devices=devices))
    api.create(copy.deepcopy(CLASSES["alveo"]))
    name = CLASSES["alveo"]["metadata"]["name"]
    api.create(claim_of("plain", name))
    with pytest.raises(AllocationError, match="untainted"):
        allocate_claim(api, NAMESPACE, "plain", NODE)
    api.create(claim_of("tolerant", name, tolerations=[
        {"key": taint_key(DRIVER), "operator": "Exists", "effect": "NoSchedule"}]))
    assert results(allocate_claim(api, NAMESPACE, "tolerant", NODE)) == ["pci-0000-17-00-1"]


def test_request_selectors_narrow_the_class(api):
    name = CLASSES["intel"]["metadata"]["name"]
    numa = 'device.attributes["resource.kubernetes.io"].numaNode == 1'
    api.create(claim_of("numa1", name, selectors=[numa]))
    assert results(allocate_claim(api, NAMESPACE, "numa1", NODE)) == ["pci-0000-d8-00-0"]


def test_a_cel_runtime_error_aborts_the_allocation(api):
    name = CLASSES["intel"]["metadata"]["name"]
    api.create(claim_of("broken", name, selectors=[
        f'device.attributes["{DRIVER}"].xclbinUUID == "{XCLBIN}"']))
    with pytest.raises(AllocationError, match="CEL runtime error"):
        allocate_claim(api, NAMESPACE, "broken", NODE)


def test_a_class_with_a_changed_selector_selects_nothing_else(api):
    """The check can fail: the same claim against an interface no port has finds none."""
    other = copy.deepcopy(CLASSES["intel"])
    other["metadata"]["name"] = "other-fim.accelerator.b-com.com"
    del other["spec"]["extendedResourceName"]
    selector = other["spec"]["selectors"][2]["cel"]
    selector["expression"] = selector["expression"].replace("3a00972ec9bf4b2a8e3c1c5e5a6f0d11",
                                                            WRONG_INTERFACE)
    api.create(other)
    api.create(claim_of("other", other["metadata"]["name"]))
    # Only the port built for that FIM, and programmable.
    assert results(allocate_claim(api, NAMESPACE, "other", NODE)) == ["pci-0000-c0-00-0"]


def test_the_extended_resource_claim_of_a_pod(api):
    pod_uid = "8e3c1d2a-0b4f-4e6a-9c7d-5f1e2a3b4c5d"
    claim = extended_resource_claim(api, "workloads", "pod-a", "app", "b-com.com/nlb0", 2,
                                    node_name=NODE, pod_uid=pod_uid)
    meta = claim["metadata"]
    assert meta["name"].startswith("pod-a-extended-resources-")
    assert meta["annotations"] == {EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"}
    assert meta["ownerReferences"] == [{"apiVersion": "v1", "kind": "Pod", "name": "pod-a",
                                        "uid": pod_uid, "controller": True,
                                        "blockOwnerDeletion": True}]
    (request,) = claim["spec"]["devices"]["requests"]
    assert request["name"] == "container-0-request-0"
    assert request["exactly"]["deviceClassName"] == CLASSES["intel"]["metadata"]["name"]
    allocation = claim["status"]["allocation"]
    assert len(set(results(claim))) == 2
    assert allocation["devices"]["config"][0]["source"] == "FromClass"
    assert allocation["devices"]["config"][0]["requests"] == ["container-0-request-0"]
    assert request_mapping(claim, "app", "b-com.com/nlb0") == [
        {"containerName": "app", "resourceName": "b-com.com/nlb0",
         "requestName": "container-0-request-0"}]


def test_a_resource_no_class_maps_is_refused(api):
    with pytest.raises(AllocationError, match="no DeviceClass maps"):
        extended_resource_claim(api, "workloads", "pod-b", "app", "b-com.com/vadd", 1,
                                node_name=NODE)


def test_an_allocated_claim_is_not_allocated_again(api):
    name = CLASSES["intel"]["metadata"]["name"]
    api.create(claim_of("once", name))
    allocate_claim(api, NAMESPACE, "once", NODE)
    with pytest.raises(AllocationError, match="allocated already"):
        allocate_claim(api, NAMESPACE, "once", NODE)
