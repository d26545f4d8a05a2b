"""ResourceClaims of v1, v1beta2 and v1beta1 read into the driver's claim type.

The claims are ones a server accepts (checked with ``compat_tests.apiserver.validate``: created
without status, then allocated by a status update as the scheduler does) and are read back the
way the server converts them for a client of each version.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from api_versions.resource_claims import parse_claim
from compat_tests.apiserver import load_model, validate
from compat_tests.apiserver.pipeline import decode_write, encode_read
from value_types.claims import AllocationResult, ClaimAllocation, ClaimRef

DRIVER = "fpga.b-com.com"
OTHER = "gpu.example.com"
NODE = "worker-1"
VERSIONS = ("v1", "v1beta2", "v1beta1")
REF = ClaimRef(namespace="team-a", name="job-7-fpga", uid="0b8e3f7c-5d3a-4f0e-9a51-7c2d1e6b9a40")


def request(version: str, name: str, subrequests: tuple[str, ...] = ()) -> dict[str, Any]:
    """One device request as ``version`` spells it (v1beta1 keeps the fields flat)."""
    if subrequests:
        return {"name": name, "firstAvailable": [
            {"name": sub, "deviceClassName": DRIVER} for sub in subrequests]}
    if version == "v1beta1":
        return {"name": name, "deviceClassName": DRIVER}
    return {"name": name, "exactly": {"deviceClassName": DRIVER}}


def claim(version: str, results: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """A claim with a plain request ``fpga``, a prioritized list ``accel`` (subrequests
    ``big``, ``small``) and a ``gpu`` request; allocated when ``results`` is given."""
    obj: dict[str, Any] = {
        "apiVersion": f"resource.k8s.io/{version}",
        "kind": "ResourceClaim",
        "metadata": {"namespace": REF.namespace, "name": REF.name, "uid": REF.uid},
        "spec": {"devices": {"requests": [
            request(version, "fpga"), request(version, "accel", ("big", "small")),
            request(version, "gpu")]}},
    }
    if results is not None:
        obj["status"] = {"allocation": {
            "devices": {"results": results},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]},
        }}
    return obj


RESULTS = [
    {"request": "fpga", "driver": DRIVER, "pool": NODE, "device": "pci-0000-5e-00-0"},
    {"request": "accel/small", "driver": DRIVER, "pool": NODE, "device": "pci-0000-3b-00-0-port1"},
    {"request": "gpu", "driver": OTHER, "pool": NODE, "device": "gpu-0"},
]
PARSED = (
    AllocationResult("fpga", DRIVER, NODE, "pci-0000-5e-00-0"),
    AllocationResult("accel/small", DRIVER, NODE, "pci-0000-3b-00-0-port1"),
    AllocationResult("gpu", OTHER, NODE, "gpu-0"),
)
CLASSES = (("fpga", "fpga.b-com.com"), ("accel/big", "fpga.b-com.com"),
           ("accel/small", "fpga.b-com.com"), ("gpu", "fpga.b-com.com"))
"""Each request's DeviceClass, however the version spells it (``exactly`` in v1 and v1beta2,
on the request in v1beta1; ``firstAvailable`` subrequests in all)."""


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("model", ["1.34", "1.36"])
def test_the_claims_used_here_are_ones_a_server_accepts(version: str, model: str) -> None:
    created = claim(version)
    assert validate(created, model=model, schema_required=True) == []
    allocated = claim(version, RESULTS)
    assert validate(allocated, model=model, old=created, status=True) == []


@pytest.mark.parametrize("version", VERSIONS)
def test_an_allocated_claim(version: str) -> None:
    parsed = parse_claim(version, claim(version, RESULTS))
    assert parsed == ClaimAllocation(ref=REF, allocated=True, results=PARSED, classes=CLASSES)
    assert parsed.results_for(DRIVER) == PARSED[:2]
    assert parsed.results_for(OTHER) == PARSED[2:]


@pytest.mark.parametrize("sent", VERSIONS)
@pytest.mark.parametrize("read", VERSIONS)
def test_a_claim_reads_the_same_whichever_version_the_server_converts_it_to(
        sent: str, read: str) -> None:
    server = load_model("1.36", {f"resource.k8s.io/{v}": True for v in VERSIONS[1:]})
    hub, _ = decode_write("resourceclaims", sent, claim(sent, RESULTS), server, "Strict")
    answered = encode_read("resourceclaims", read, hub, server)
    assert answered["apiVersion"] == f"resource.k8s.io/{read}"
    assert parse_claim(read, answered) == ClaimAllocation(REF, True, PARSED, classes=CLASSES)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("status", [None, {}, {"reservedFor": []}, {"allocation": None}])
def test_a_claim_without_an_allocation_is_not_allocated(version: str, status: Any) -> None:
    obj = claim(version)
    if status is not None:
        obj["status"] = status
    assert parse_claim(version, obj) == ClaimAllocation(ref=REF, allocated=False)


@pytest.mark.parametrize("allocation", [{}, {"devices": {}}, {"devices": {"results": []}}])
def test_an_allocation_without_devices_is_allocated_with_none(allocation: Any) -> None:
    obj = claim("v1")
    obj["status"] = {"allocation": allocation}
    parsed = parse_claim("v1", obj)
    assert (parsed.allocated, parsed.results) == (True, ())


def test_a_claim_of_other_drivers_only_has_nothing_for_us() -> None:
    parsed = parse_claim("v1", claim("v1", RESULTS[2:]))
    assert parsed.allocated and parsed.results_for(DRIVER) == ()


def test_kind_and_api_version_may_be_absent_as_in_list_items() -> None:
    obj = claim("v1beta2", RESULTS)
    del obj["apiVersion"], obj["kind"]
    assert parse_claim("v1beta2", obj).results == PARSED


def broken(version: str, change: Any) -> dict[str, Any]:
    obj = copy.deepcopy(claim(version, RESULTS))
    change(obj)
    return obj


def results_of(obj: dict[str, Any]) -> list[Any]:
    return obj["status"]["allocation"]["devices"]["results"]


@pytest.mark.parametrize(("change", "message"), [
    (lambda o: o.update(apiVersion="resource.k8s.io/v1beta1"),
     r"apiVersion: 'resource.k8s.io/v1beta1' is not 'resource.k8s.io/v1'"),
    (lambda o: o.update(kind="ResourceSlice"), "kind: 'ResourceSlice' is not 'ResourceClaim'"),
    (lambda o: o.pop("metadata"), "metadata: missing"),
    (lambda o: o["metadata"].pop("uid"), "metadata.uid: missing"),
    (lambda o: o["metadata"].update(namespace=""), "metadata.namespace: '' is not"),
    (lambda o: o["metadata"].update(name=7), "metadata.name: 7 is not"),
    (lambda o: o.update(status="allocated"), "status: expected an object"),
    (lambda o: o["status"].update(allocation=[]), "status.allocation: expected an object"),
    (lambda o: o["status"]["allocation"].update(devices="x"),
     "status.allocation.devices: expected an object"),
    (lambda o: o["status"]["allocation"]["devices"].update(results={}),
     "status.allocation.devices.results: expected a list"),
    (lambda o: results_of(o).append("pci-0000-5e-00-0"),
     r"results\[3\]: expected an object"),
    (lambda o: results_of(o)[1].pop("driver"), r"results\[1\].driver: missing"),
    (lambda o: results_of(o)[0].update(device=""), r"results\[0\].device: '' is not"),
    (lambda o: results_of(o)[0].update(pool=None), r"results\[0\].pool: missing"),
    (lambda o: results_of(o)[0].update(request="a/b/c"), r"results\[0\].request: 'a/b/c'"),
    (lambda o: results_of(o)[0].update(request="a/"), r"results\[0\].request: 'a/'"),
])
def test_malformed_claims_are_refused_naming_the_field(change: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_claim("v1", broken("v1", change))


def test_refusals_name_the_claim_and_version() -> None:
    obj = broken("v1beta2", lambda o: results_of(o)[2].pop("device"))
    with pytest.raises(ValueError, match=r"^ResourceClaim team-a/job-7-fpga \(v1beta2\): "
                                         r"status.allocation.devices.results\[2\].device"):
        parse_claim("v1beta2", obj)


@pytest.mark.parametrize("obj", [None, [], "claim"])
def test_not_an_object(obj: Any) -> None:
    with pytest.raises(ValueError, match="expected an object"):
        parse_claim("v1", obj)


def test_an_unknown_version_is_refused() -> None:
    with pytest.raises(ValueError, match="v1alpha3"):
        parse_claim("v1alpha3", claim("v1", RESULTS))


@pytest.mark.parametrize("version", VERSIONS)
def test_the_pods_a_claim_is_reserved_for_are_read_for_the_audit(version: str) -> None:
    obj = claim(version, RESULTS)
    obj["status"]["reservedFor"] = [
        {"resource": "pods", "name": "web-0", "uid": "u0"},
        {"apiGroup": "example.com", "resource": "jobs", "name": "not-a-pod", "uid": "u1"}]
    assert parse_claim(version, obj).reserved_for == ("web-0",)


SHARE = "5f0c2a9e-3b1d-4c7e-8a6f-2d9e1b7c4a30"


def shared(version: str, **result: Any) -> dict[str, Any]:
    """``claim`` whose ``fpga`` result is one share of its device (KEP-5075)."""
    results = copy.deepcopy(RESULTS)
    results[0].update(result)
    return claim(version, results)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_share_is_read_with_its_id_and_the_contexts_it_consumed(version: str) -> None:
    created = claim(version)
    allocated = shared(version, shareID=SHARE, consumedCapacity={"contexts": "2"})
    assert validate(allocated, model="1.36", old=created, status=True) == [], \
        "a result the 1.36 API server accepts"
    [mine, *_] = parse_claim(version, allocated).results
    assert (mine.share_id, mine.consumed_contexts) == (SHARE, 2)
    assert parse_claim(version, claim(version, RESULTS)).results[0].share_id is None


@pytest.mark.parametrize(("quantity", "count"), [("1", 1), ("3", 3), ("2000m", 2),
                                                  ("2e0", 2), ("1k", 1000)])
def test_the_contexts_quantity_may_be_spelt_as_any_quantity(quantity: str, count: int) -> None:
    obj = shared("v1", shareID=SHARE, consumedCapacity={"contexts": quantity, "memory": "1Gi"})
    assert parse_claim("v1", obj).results[0].consumed_contexts == count


def test_a_share_without_consumed_contexts_has_none() -> None:
    obj = shared("v1", shareID=SHARE, consumedCapacity={"memory": "1Gi"})
    assert parse_claim("v1", obj).results[0].consumed_contexts is None


@pytest.mark.parametrize(("result", "message"), [
    ({"shareID": "not-a-uuid"}, r"results\[0\].shareID: 'not-a-uuid' is not a UUID"),
    ({"shareID": SHARE.upper()}, r"results\[0\].shareID: .* is not a UUID in RFC 4122"),
    ({"shareID": SHARE + "-" + "0" * 80}, r"results\[0\].shareID: .* is not a UUID"),
    ({"shareID": 7}, r"results\[0\].shareID: 7 is not a UUID"),
    ({"shareID": SHARE, "consumedCapacity": {"contexts": "1500m"}},
     r"consumedCapacity.contexts: '1500m' is not a positive whole number of contexts"),
    ({"shareID": SHARE, "consumedCapacity": {"contexts": "0"}},
     r"consumedCapacity.contexts: '0' is not a positive whole number"),
    ({"shareID": SHARE, "consumedCapacity": {"contexts": "-2"}}, r"'-2' is not a positive"),
    ({"shareID": SHARE, "consumedCapacity": {"contexts": 2}}, r"2 is not a positive"),
    ({"shareID": SHARE, "consumedCapacity": {"contexts": "1e9"}}, r"'1e9' is not a positive"),
    ({"shareID": SHARE, "consumedCapacity": "2"}, r"consumedCapacity: expected an object"),
])
def test_a_malformed_share_is_refused_naming_the_field(result: dict[str, Any],
                                                       message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_claim("v1", shared("v1", **result), DRIVER)


def test_another_drivers_contexts_are_its_own_business() -> None:
    results = copy.deepcopy(RESULTS)
    results[2].update(shareID=SHARE, consumedCapacity={"contexts": "500m"})
    parsed = parse_claim("v1", claim("v1", results), DRIVER)
    assert (parsed.results[2].share_id, parsed.results[2].consumed_contexts) == (SHARE, None)
    with pytest.raises(ValueError, match="'500m' is not a positive whole number"):
        parse_claim("v1", claim("v1", results))
