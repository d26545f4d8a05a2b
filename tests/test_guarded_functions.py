"""Which functions the catalogue guards and which namespaces a guard lets through (the pure
rules of plugin.programming.guarded; the daemon's use of them is
compat_tests/test_dra_function_grants_serve.py's)."""

from __future__ import annotations

from plugin.programming.guarded import GuardedFunctions, granted_classes, guarded_functions

DRIVER = "accelerator.b-com.com"
APP = "5c4ed2a35c524d6e9d167a8d8b2bc7e0"
CHOSEN = "0b6f3c1e7d2a4e598c412f9a6d3e5b70"
CLEAR = "9a1c2e3f4b5d4c6e8f701a2b3c4d5e6f"


def fpga_function(**fields: object) -> dict[str, object]:
    return {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "FpgaFunction", **fields}


CONFIGS = {
    "app": [fpga_function(xclbinUUID=APP, image="app.xclbin", clearOnUnprepare={
        "xclbinUUID": CLEAR, "image": "clear.xclbin"},
        allowedClaimFunctions=[{"xclbinUUID": CHOSEN}])],
    "plain": [],
    "unguarded-same": [fpga_function(xclbinUUID=APP, image="app.xclbin")],
}


def test_a_guarded_class_guards_its_function_and_what_its_claims_may_choose_not_its_clear():
    found = guarded_functions(DRIVER, ["app", "missing"], CONFIGS)
    assert found.classes == {("alveo", APP): frozenset({"app"}),
                             ("alveo", CHOSEN): frozenset({"app"})}
    assert not found.guards(("alveo", CLEAR)) and found.guards(("alveo", APP))
    assert not found.guards(None)


def test_only_exactly_true_grants_and_any_class_naming_the_function_will_do():
    assert granted_classes({"functions.accelerator.b-com.com/app": "true",
                            "functions.accelerator.b-com.com/b": "yes"}) == {"app"}
    found = guarded_functions(DRIVER, ["app"], CONFIGS)
    assert found.refusal("team-a", ("alveo", APP), frozenset({"app"})) is None
    refusal = found.refusal("team-b", ("alveo", APP), frozenset({"other"}))
    assert refusal is not None and "kubectl label namespace team-b " \
        "functions.accelerator.b-com.com/app=true" in refusal
    # An unguarded function (or nothing) is anyone's.
    assert found.refusal("team-b", ("intel", "00" * 16), frozenset()) is None


def test_what_cannot_be_read_fails_closed_for_a_device_holding_a_function():
    blind = GuardedFunctions(blind="the DeviceClasses cannot be read: 403")
    assert blind.refusal("team-a", ("intel", "00" * 16), frozenset({"app"})) is not None
    assert blind.refusal("team-a", None, frozenset()) is None
    found = guarded_functions(DRIVER, ["app"], CONFIGS)
    assert found.refusal("team-a", ("alveo", APP), None, "Namespace team-a: 403") is not None
    # A guarded class that cannot be parsed may name any function: granted all such, or not.
    broken = guarded_functions(DRIVER, ["app", "broken"],
                               {**CONFIGS, "broken": [fpga_function(xclbinUUID="nope")]})
    assert broken.refusal("team-b", ("intel", "00" * 16), frozenset()) is not None
    assert broken.refusal("team-b", ("intel", "00" * 16), frozenset({"broken"})) is None
    # The catalogue unreadable: every class naming a function is taken as guarded.
    assumed = guarded_functions(DRIVER, [], CONFIGS, "the catalogue cannot be read")
    assert assumed.classes[("alveo", APP)] == {"app", "unguarded-same"}
    assert "taken as guarded" in assumed.said("refused")
