"""The driver's opaque configuration: which function a request needs, checked strictly."""

from __future__ import annotations

from typing import Any

import pytest

from api_versions.resource_claims import parse_claim
from plugin.programming.function_config import NO_FUNCTIONS, functions_of, parse_function

DRIVER = "accelerator.b-com.com"
AFU = "d8424dc4-a4a3-c413-f89e-433683f9040b"
AGFI = "agfi-0fcf87119b8e97bf3"


def params(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "FpgaFunction", **fields}


def test_an_afu_id_is_normalised_and_keeps_its_image() -> None:
    spec = parse_function(DRIVER, params(afuID=AFU.upper(), image="nlb0/nlb0.gbs"), "here",
                          from_class=True)
    assert (spec.family, spec.field, spec.function_id, spec.image) == (
        "intel", "afuID", AFU.replace("-", ""), "nlb0/nlb0.gbs")


def test_an_agfi_is_loaded_by_id_alone() -> None:
    spec = parse_function(DRIVER, params(agfiID=AGFI), "here", from_class=False)
    assert (spec.family, spec.function_id, spec.image) == ("aws", AGFI, None)


@pytest.mark.parametrize(("fields", "words"), [
    ({"afuID": AFU, "image": "a.gbs", "afuId": AFU},
     "unknown field 'afuId' (did you mean 'afuID'?)"),
    ({"image": "a.gbs"}, "exactly one of afuID or xclbinUUID or agfiID"),
    ({"afuID": AFU, "xclbinUUID": AFU, "image": "a"}, "afuID and xclbinUUID are both given"),
    ({"afuID": AFU}, "image is required with afuID"),
    ({"afuID": "not-an-id", "image": "a"}, "is not a 128-bit ID"),
    ({"afuID": 7, "image": "a"}, "afuID must be a string"),
    ({"agfiID": AGFI, "image": "a"}, "image is not used with agfiID"),
    ({"agfiID": "afi-0123"}, "is not an AGFI ID"),
    ({"afuID": AFU, "image": "../etc/shadow"}, "must be a path inside the image library"),
    ({"afuID": AFU, "image": "/etc/shadow"}, "must be a path inside the image library"),
    ({"afuID": AFU, "image": ""}, "image must be a non-empty string"),
])
def test_every_malformed_configuration_names_its_problem(fields: dict[str, Any],
                                                         words: str) -> None:
    with pytest.raises(ValueError, match="claim configuration 0") as refused:
        functions_of(DRIVER, [("FromClaim", ("gpu",), params(**fields))])
    assert words in str(refused.value)


def test_the_kind_and_version_must_be_the_drivers() -> None:
    with pytest.raises(ValueError, match=r"apiVersion 'other\.io/v1alpha1'"):
        parse_function(DRIVER, {**params(afuID=AFU, image="a"),
                                "apiVersion": "other.io/v1alpha1"}, "here", True)
    with pytest.raises(ValueError, match="kind 'FpgaFunctions' is not 'FpgaFunction'"):
        parse_function(DRIVER, {**params(afuID=AFU, image="a"), "kind": "FpgaFunctions"},
                       "here", True)
    with pytest.raises(ValueError, match="parameters must be an object"):
        parse_function(DRIVER, ["afuID"], "here", True)


def test_clearing_is_the_admins_choice_only() -> None:
    clear = {"afuID": AFU, "image": "blank.gbs"}
    spec = parse_function(DRIVER, params(afuID=AFU, image="a.gbs", clearOnUnprepare=clear),
                          "here", from_class=True)
    assert spec.clear is not None and spec.clear.image == "blank.gbs"
    with pytest.raises(ValueError, match="only be set in a DeviceClass"):
        parse_function(DRIVER, params(afuID=AFU, image="a.gbs", clearOnUnprepare=clear),
                       "here", from_class=False)
    with pytest.raises(ValueError, match="names a function of the aws family"):
        parse_function(DRIVER, params(afuID=AFU, image="a.gbs",
                                      clearOnUnprepare={"agfiID": AGFI}), "here", True)


def test_the_claims_own_configuration_overrides_its_class_for_the_requests_it_names() -> None:
    other = "9e1f4ab2c6d3487a8b0e5f1a2c3d4e5f"
    functions = functions_of(DRIVER, [
        ("FromClass", ("fpga",), params(afuID=AFU, image="nlb0.gbs")),
        ("FromClass", ("spare",), params(afuID=AFU, image="nlb0.gbs")),
        ("FromClaim", ("fpga",), params(afuID=other, image="nlb3.gbs")),
    ])
    assert functions.function_for("fpga").function_id == other
    assert functions.function_for("fpga/fast").function_id == other  # a subrequest
    assert functions.function_for("spare").function_id == AFU.replace("-", "")
    assert functions.function_for("none") is None
    assert functions_of(DRIVER, []) is NO_FUNCTIONS


def test_a_claims_allocation_carries_its_configurations_in_order() -> None:
    obj = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
           "metadata": {"namespace": "ns", "name": "c", "uid": "u"},
           "status": {"allocation": {"devices": {
               "results": [{"request": "fpga", "driver": DRIVER, "pool": "n", "device": "d"}],
               "config": [
                   {"source": "FromClass", "requests": ["fpga"],
                    "opaque": {"driver": DRIVER, "parameters": params(agfiID=AGFI)}},
                   {"source": "FromClaim",
                    "opaque": {"driver": "other.io", "parameters": {"x": 1}}},
               ]}}}}
    claim = parse_claim("v1", obj)
    assert [(c.source, c.requests, c.driver) for c in claim.configs] == [
        ("FromClass", ("fpga",), DRIVER), ("FromClaim", (), "other.io")]
    assert [c.driver for c in claim.configs_for(DRIVER, "fpga")] == [DRIVER]
    assert claim.configs_for(DRIVER, "other") == ()
    bad = {**obj, "status": {"allocation": {"devices": {"results": [], "config": [
        {"source": "FromNowhere", "opaque": {"driver": DRIVER, "parameters": {}}}]}}}}
    with pytest.raises(ValueError, match=r"config\[0\]\.source"):
        parse_claim("v1", bad)


def test_a_claims_own_function_keeps_its_classs_clear() -> None:
    functions = functions_of(DRIVER, [
        ("FromClass", ("fpga",), params(afuID=AFU, image="nlb0.gbs",
                                        clearOnUnprepare={"afuID": AFU, "image": "blank.gbs"})),
        ("FromClaim", ("fpga",), params(afuID="9e1f4ab2c6d3487a8b0e5f1a2c3d4e5f",
                                        image="mine.gbs")),
    ])
    mine = functions.function_for("fpga")
    assert mine.image == "mine.gbs"
    assert mine.clear is not None and mine.clear.image == "blank.gbs"
