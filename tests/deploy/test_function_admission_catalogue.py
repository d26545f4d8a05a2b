"""The function-admission policy while its catalogue ConfigMap is missing (deleted by hand,
pruned by a GitOps tool, or gone first in ``kubectl delete -k``), as the kustomize component
and the chart render it, judged by its own CEL in the API server's order (admission_policy.py:
the binding's parameters are looked up first, then the match conditions, then the
validations).

Only what asks for a function class of the catalogue is judged: a Pod or claim asking for
none (the DaemonSet's own pods, a CNI pod, a claim of the plain class) is admitted whatever
state the catalogue is in, and the release namespace is left alone. What asks for a function
class stays refused in a namespace without the grant, the ConfigMap there or not: the policy
carries its own copy of the catalogue it was rendered with.
"""

from __future__ import annotations

import copy
from typing import Any

import admission_policy
import pytest
from admission_policy import Request, admit, admit_all
from helm_render import render as helm_render
from k8s_schemas import validate
from test_function_admission import (
    HOME,
    LABEL,
    NLB0,
    PLAIN,
    SCHEMAS,
    VADD,
    bindings,
    chart_values,
    claim,
    namespace,
    parts,
    pod,
    render_at_home,
    schema_problems,
    template,
)

NAMES = list(HOME)


@pytest.fixture(scope="module")
def renderings(kubectl, tmp_path_factory) -> dict[str, list[dict[str, Any]]]:
    return render_at_home(kubectl, tmp_path_factory.mktemp("function-admission-catalogue"))


def without_catalogue(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    _, _, catalogue = parts(objects)
    return [o for o in objects if o is not catalogue]


def decide(objects: list[dict[str, Any]], request: Request, ns: dict[str, Any],
           catalogue: bool) -> admission_policy.Decision:
    """Through both bindings, with the catalogue ConfigMap in the cluster or not."""
    policy, _, _ = parts(objects)
    params = objects if catalogue else without_catalogue(objects)
    return admit_all(policy, bindings(objects), request, ns, params)


def daemonset_pod(objects: list[dict[str, Any]], ns: str) -> Request:
    """A Pod as the rendered DaemonSet's controller creates it, in ``ns``."""
    (daemonset,) = [o for o in objects if o["kind"] == "DaemonSet"]
    template_ = daemonset["spec"]["template"]
    obj = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "accelerator-device-plugin-x7k2p", "namespace": ns,
                        "labels": template_["metadata"]["labels"]},
           "spec": copy.deepcopy(template_["spec"])}
    assert schema_problems(obj) == [], obj
    return Request("CREATE", "pods", obj, ns)


NOT_ASKING = [
    ("pod without resources", lambda: pod()),
    ("pod with cpu and memory", lambda: pod({"requests": {"cpu": "100m"},
                                             "limits": {"memory": "64Mi"}})),
    ("pod asking for the plain resource", lambda: pod({"limits": {"b-com.com/accelerator": "1"}})),
    ("claim of the plain class", lambda: claim("v1", PLAIN)),
    ("template of the plain class", lambda: template("v1", PLAIN)),
]
ASKING = [
    ("pod asking for b-com.com/nlb0", lambda: pod({"limits": {"b-com.com/nlb0": "1"}}), NLB0),
    ("pod asking for the class's own resource",
     lambda: pod({"limits": {f"deviceclass.resource.kubernetes.io/{VADD}": "1"}}), VADD),
    ("claim naming the class", lambda: claim("v1", NLB0), NLB0),
    ("claim v1beta1 naming the class", lambda: claim("v1beta1", VADD), VADD),
    ("template naming the class", lambda: template("v1", PLAIN, NLB0, first_available=True),
     NLB0),
]


@pytest.mark.parametrize("catalogue", [True, False], ids=["catalogue", "no-catalogue"])
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(("case", "make"), NOT_ASKING, ids=[c[0] for c in NOT_ASKING])
def test_what_asks_for_no_function_is_admitted_whatever_the_catalogue(renderings, name,
                                                                      catalogue, case, make):
    decision = decide(renderings[name], make(), namespace("team-b"), catalogue)
    assert decision.allowed, (case, decision.messages)


@pytest.mark.parametrize("catalogue", [True, False], ids=["catalogue", "no-catalogue"])
@pytest.mark.parametrize("name", NAMES)
def test_the_daemonsets_pods_are_admitted_whatever_the_catalogue(renderings, name, catalogue):
    home = HOME[name]
    request = daemonset_pod(renderings[name], home)
    decision = decide(renderings[name], request, namespace(home), catalogue)
    assert decision.allowed, decision.messages
    # Not even looked at: the release namespace is left alone.
    assert not decision.matched


@pytest.mark.parametrize("catalogue", [True, False], ids=["catalogue", "no-catalogue"])
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(("case", "make", "cls"), ASKING, ids=[c[0] for c in ASKING])
def test_what_asks_for_a_function_stays_guarded_whatever_the_catalogue(renderings, name,
                                                                       catalogue, case, make,
                                                                       cls):
    request = make()
    refused = decide(renderings[name], request, namespace("team-b"), catalogue)
    assert not refused.allowed, case
    assert f"kubectl label namespace team-b {LABEL}{cls}=true" in refused.messages[0]
    granted = decide(renderings[name], request, namespace("team-a", **{cls: "true"}),
                     catalogue)
    assert granted.allowed, (case, granted.messages)


@pytest.mark.parametrize("name", NAMES)
def test_match_conditions_alone_would_not_do(renderings, name):
    """The fault as found on a 1.36.2 API server: with the binding's former
    parameterNotFoundAction Deny, a missing catalogue refuses a Pod asking for nothing, match
    conditions or not, since the server looks the parameters up before it evaluates them."""
    objects = renderings[name]
    policy, live, _ = parts(objects)
    assert policy["spec"]["matchConditions"]
    former = copy.deepcopy(live)
    former["spec"]["paramRef"]["parameterNotFoundAction"] = "Deny"
    decision = admit(policy, former, pod(), namespace("team-b"), without_catalogue(objects))
    assert not decision.allowed
    assert decision.messages == [f"failed to configure binding: {admission_policy.NOT_FOUND}"]
    # Present, the same binding lets it through: the match conditions skip it.
    assert admit(policy, former, pod(), namespace("team-b"), objects).allowed


@pytest.mark.parametrize("name", NAMES)
def test_the_match_conditions_skip_pods_asking_for_no_extended_resource(renderings, name):
    """Skipped before any validation, so no validation's failure can refuse them; what asks
    for an extended resource or a device goes on, and the validation judges it."""
    objects = renderings[name]
    policy, _, _ = parts(objects)
    broken = copy.deepcopy(policy)
    broken["spec"]["validations"][0]["expression"] = "variables.no_such_variable"
    skipped = [pod(), pod({"requests": {"cpu": "1"}}, init={"limits": {"memory": "1Gi"}}),
               daemonset_pod(objects, "team-b")]
    judged = [pod({"limits": {"b-com.com/accelerator": "1"}}), claim("v1", PLAIN),
              template("v1", PLAIN), pod({"limits": {"b-com.com/nlb0": "1"}})]
    for binding in bindings(objects):
        for request in skipped:
            assert admit(broken, binding, request, namespace("team-b"), objects).allowed
        for request in judged:
            assert not admit(broken, binding, request, namespace("team-b"), objects).allowed
            assert admit(policy, binding, request, namespace("team-a", **{NLB0: "true"}),
                         objects).allowed


@pytest.mark.parametrize("name", NAMES)
def test_the_match_conditions_read_what_the_api_server_gives_them(renderings, name):
    """The API server compiles match conditions without ``variables`` and ``namespaceObject``
    and refuses a policy whose conditions name either."""
    policy, _, _ = parts(renderings[name])
    for condition in policy["spec"]["matchConditions"]:
        assert "variables" not in condition["expression"]
        assert "namespaceObject" not in condition["expression"]


@pytest.mark.parametrize("name", NAMES)
def test_a_class_added_in_place_is_guarded_while_the_configmap_is_there(renderings, name):
    """The live catalogue can add classes to the policy's copy; while it is missing, only the
    copy's classes are guarded (docs/programming.md says so)."""
    objects = copy.deepcopy(renderings[name])
    _, _, catalogue = parts(objects)
    catalogue["data"]["nlb1.accelerator.b-com.com"] = "b-com.com/nlb1"
    asking = pod({"limits": {"b-com.com/nlb1": "1"}})
    assert not decide(objects, asking, namespace("team-b"), catalogue=True).allowed
    assert decide(objects, asking, namespace("team-b"), catalogue=False).allowed


def test_the_release_namespace_can_be_guarded_too(renderings):
    values = chart_values(exemptReleaseNamespace=False)
    objects = helm_render(values, namespace="fpga-system")
    for binding in bindings(objects):
        (kept,) = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
        assert kept["values"] == ["kube-system"]
    home = namespace("fpga-system")
    for catalogue in (True, False):
        # Judged now, and still admitted: the DaemonSet's pods ask for no function.
        decision = decide(objects, daemonset_pod(objects, "fpga-system"), home, catalogue)
        assert decision.matched and decision.allowed, decision.messages
        asking = pod({"limits": {"b-com.com/nlb0": "1"}}, ns="fpga-system")
        assert not decide(objects, asking, home, catalogue).allowed
    # The default leaves it alone.
    asking = pod({"limits": {"b-com.com/nlb0": "1"}}, ns="fpga-system")
    assert not decide(renderings["chart"], asking, home, catalogue=False).matched


def test_no_exemption_at_all_renders_no_selector():
    objects = helm_render(chart_values(exemptReleaseNamespace=False, exemptNamespaces=[]))
    for binding in bindings(objects):
        assert "matchResources" not in binding["spec"]
        assert validate(binding, SCHEMAS) == []


@pytest.mark.parametrize("name", NAMES)
def test_the_exemptions_name_the_install_namespace(renderings, name):
    for binding in bindings(renderings[name]):
        selector = binding["spec"]["matchResources"]["namespaceSelector"]
        assert selector["matchExpressions"] == [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [v]}
            for v in ("kube-system", HOME[name])]
    for obj in renderings[name]:
        assert validate(obj, SCHEMAS) == [], obj["kind"]


@pytest.mark.parametrize("name", NAMES)
def test_the_policys_copy_is_the_catalogue_it_ships_with(renderings, name):
    """The binding without parameters reads the copy in the policy: it must hold what the
    ConfigMap holds as rendered, or a missing ConfigMap would change what is guarded."""
    policy, _, catalogue = parts(renderings[name])
    (copy_,) = [v["expression"] for v in policy["spec"]["variables"]
                if v["name"] == "catalogue"]
    activation = {"params": None}
    found = admission_policy.program(copy_).evaluate(
        {k: admission_policy.celpy.json_to_cel(v) for k, v in activation.items()})
    assert {str(k): str(v) for k, v in found.items()} == catalogue["data"]
