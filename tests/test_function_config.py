"""The driver's opaque configuration: which function a request needs, checked strictly."""

from __future__ import annotations

from typing import Any

import pytest

from api_versions.resource_claims import parse_claim
from plugin.programming.function_config import (
    NO_FUNCTIONS,
    FunctionRefused,
    functions_of,
    needs_class_configs,
    parse_function,
)

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


OTHER = "9e1f4ab2c6d3487a8b0e5f1a2c3d4e5f"


def test_the_claims_own_configuration_overrides_its_class_for_the_requests_it_names() -> None:
    other = OTHER
    functions = functions_of(DRIVER, [
        ("FromClass", ("fpga",), params(afuID=AFU, image="nlb0.gbs",
                                        allowedClaimFunctions=[{"afuID": other}])),
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
                                        clearOnUnprepare={"afuID": AFU, "image": "blank.gbs"},
                                        allowedClaimFunctions=[{"afuID": OTHER}])),
        ("FromClaim", ("fpga",), params(afuID="9e1f4ab2c6d3487a8b0e5f1a2c3d4e5f",
                                        image="mine.gbs")),
    ])
    mine = functions.function_for("fpga")
    assert mine.image == "mine.gbs"
    assert mine.clear is not None and mine.clear.image == "blank.gbs"


DIGEST = "ab" * 32


def test_a_claims_own_function_is_refused_unless_its_class_allows_it() -> None:
    functions = functions_of(DRIVER, [
        ("FromClass", ("fpga",), params(afuID=AFU, image="nlb0.gbs")),
        ("FromClaim", ("fpga",), params(afuID=OTHER, image="mine.gbs")),
    ], {"fpga": "nlb0.intel"})
    with pytest.raises(FunctionRefused) as refused:
        functions.function_for("fpga")
    words = str(refused.value)
    assert "claim configuration 0" in words and "DeviceClass 'nlb0.intel'" in words
    assert "afuID 9e1f4ab2-c6d3-487a-8b0e-5f1a2c3d4e5f" in words and "(field afuID)" in words
    assert "allowedClaimFunctions" in words
    assert refused.value.device_class == "nlb0.intel" and refused.value.request == "fpga"


def test_a_class_without_any_function_allows_claims_none() -> None:
    functions = functions_of(DRIVER, [
        ("FromClaim", (), params(afuID=OTHER, image="mine.gbs"))], {"fpga": "plain"})
    with pytest.raises(FunctionRefused, match=r"DeviceClass 'plain'.*allows: none"):
        functions.function_for("fpga")


def test_restating_the_classs_own_function_is_allowed_but_not_with_another_image() -> None:
    cls = ("FromClass", ("fpga",), params(afuID=AFU, image="nlb0.gbs", sha256=DIGEST))
    same = functions_of(DRIVER, [cls, ("FromClaim", (), params(afuID=AFU, image="nlb0.gbs"))])
    assert same.function_for("fpga").sha256 == DIGEST  # the class's pin carries over
    other_file = functions_of(DRIVER, [cls, ("FromClaim", (), params(afuID=AFU,
                                                                      image="evil.gbs"))])
    with pytest.raises(FunctionRefused):
        other_file.function_for("fpga")


def test_an_allowed_entry_pins_the_image_and_digest_it_names() -> None:
    cls = ("FromClass", ("fpga",), params(allowedClaimFunctions=[
        {"afuID": OTHER, "image": "nlb3.gbs", "sha256": DIGEST}]))
    ok = functions_of(DRIVER, [cls, ("FromClaim", (), params(afuID=OTHER, image="nlb3.gbs"))])
    assert (ok.function_for("fpga").image, ok.function_for("fpga").sha256) == ("nlb3.gbs",
                                                                                DIGEST)
    for claim in (params(afuID=OTHER, image="other.gbs"),
                  params(afuID=OTHER, image="nlb3.gbs", sha256="cd" * 32)):
        refused = functions_of(DRIVER, [cls, ("FromClaim", (), claim)])
        with pytest.raises(FunctionRefused):
            refused.function_for("fpga")
    # A class that only lists choices names no function itself: its claims without one
    # get none.
    assert functions_of(DRIVER, [cls]).function_for("fpga") is None


def test_only_a_class_may_list_what_claims_choose() -> None:
    with pytest.raises(ValueError, match="allowedClaimFunctions may only be set in a Device"):
        functions_of(DRIVER, [("FromClaim", (), params(
            afuID=AFU, image="a.gbs", allowedClaimFunctions=[{"afuID": OTHER}]))])


@pytest.mark.parametrize(("fields", "words"), [
    ({"afuID": AFU, "image": "a.gbs", "sha256": "xyz"}, "is not a SHA-256 digest"),
    ({"afuID": AFU, "image": "a.gbs", "sha256": 5}, "sha256 must be a string"),
    ({"agfiID": AGFI, "sha256": DIGEST}, "sha256 is not used with agfiID"),
    ({"allowedClaimFunctions": "nlb3"}, "must be a list of functions"),
    ({"allowedClaimFunctions": [{"afuId": AFU}]}, "did you mean 'afuID'"),
    ({"allowedClaimFunctions": [{"afuID": AFU}], "image": "a.gbs"},
     "image is given but no function"),
])
def test_malformed_digests_and_catalogues_name_their_problem(fields, words) -> None:
    with pytest.raises(ValueError, match="DeviceClass configuration 0") as refused:
        functions_of(DRIVER, [("FromClass", (), params(**fields))])
    assert words in str(refused.value)


def test_a_digest_is_normalised_and_pins_the_clear_too() -> None:
    spec = parse_function(DRIVER, params(afuID=AFU, image="a.gbs",
                                         sha256=f"sha256:{DIGEST.upper()}",
                                         clearOnUnprepare={"afuID": AFU, "image": "b.gbs",
                                                           "sha256": DIGEST}), "here", True)
    assert spec.sha256 == DIGEST and spec.clear is not None and spec.clear.sha256 == DIGEST


# --- class configurations naming no request (schedulers before kubernetes#134793) ---------

NLB0 = params(afuID=AFU, image="nlb0.gbs")
NLB3 = params(afuID="9e1f4ab2-0000-4000-8000-000000000003", image="nlb3.gbs")
TWO_CLASSES = {"a": "nlb0-class", "b": "nlb3-class"}
HELD = {"nlb0-class": [NLB0], "nlb3-class": [NLB3]}


def test_a_class_configuration_naming_no_request_applies_to_its_own_classs_requests() -> None:
    """Request a of one class, b of another, each class with its own function, copied by an
    old scheduler with no request names: each request gets its own class's function, not
    the last one copied."""
    configs = [("FromClass", (), NLB0), ("FromClass", (), NLB3)]
    functions = functions_of(DRIVER, configs, TWO_CLASSES, HELD)
    assert (a := functions.function_for("a")) is not None and a.image == "nlb0.gbs"
    assert (b := functions.function_for("b")) is not None and b.image == "nlb3.gbs"
    # Copied in the other order (request b first in the claim): the same.
    functions = functions_of(DRIVER, configs[::-1], TWO_CLASSES, HELD)
    assert (a := functions.function_for("a")) is not None and a.image == "nlb0.gbs"
    assert (b := functions.function_for("b")) is not None and b.image == "nlb3.gbs"


def test_a_class_configuration_of_a_class_with_none_leaves_the_other_request_alone() -> None:
    functions = functions_of(DRIVER, [("FromClass", (), NLB3)], TWO_CLASSES,
                             {"nlb0-class": [], "nlb3-class": [NLB3]})
    assert functions.function_for("a") is None
    assert (b := functions.function_for("b")) is not None and b.image == "nlb3.gbs"


def test_a_claims_configuration_naming_no_request_still_applies_to_every_request() -> None:
    functions = functions_of(DRIVER, [("FromClass", (), params(allowedClaimFunctions=[
        {"afuID": AFU}])), ("FromClaim", (), NLB0)], {"a": "open", "b": "open"})
    assert (a := functions.function_for("a")) is not None and a.image == "nlb0.gbs"
    assert (b := functions.function_for("b")) is not None and b.image == "nlb0.gbs"


def test_with_requests_of_one_class_no_class_need_be_looked_up() -> None:
    configs = [("FromClass", (), NLB0), ("FromClass", (), NLB0)]
    assert not needs_class_configs(configs, {"a": "nlb0-class", "b": "nlb0-class"})
    assert needs_class_configs(configs, TWO_CLASSES)
    assert not needs_class_configs([("FromClass", ("a",), NLB0)], TWO_CLASSES)
    functions = functions_of(DRIVER, configs, {"a": "nlb0-class", "b": "nlb0-class"})
    assert (b := functions.function_for("b")) is not None and b.image == "nlb0.gbs"


def test_a_class_configuration_no_class_holds_any_more_refuses_the_claim() -> None:
    """The class changed since the allocation: which request it was for cannot be told,
    and guessing could load the wrong function."""
    with pytest.raises(ValueError, match="none of the claim's DeviceClasses"):
        functions_of(DRIVER, [("FromClass", (), NLB0)], TWO_CLASSES,
                     {"nlb0-class": [NLB3], "nlb3-class": [NLB3]})
    with pytest.raises(ValueError, match="cannot be told"):
        functions_of(DRIVER, [("FromClass", (), NLB0)], TWO_CLASSES)
