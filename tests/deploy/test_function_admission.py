"""Which namespaces may use which FPGA function: the function-admission policy, as the kustomize
component and the chart render it, judged by its own CEL (read from the rendered YAML and run
with cel-python, admission_policy.py) on objects shaped as Kubernetes 1.36 serves them.

A namespace without the grant label of a catalogued class is refused ResourceClaims and
ResourceClaimTemplates naming the class (any served version, any request or firstAvailable
subrequest) and Pods asking for its extended resource (containers, init containers); objects
that name no function class, and namespaces that hold the grant, are admitted.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import admission_policy
import celpy
import pytest
import yaml
from admission_policy import Request, admit, admit_all
from deploy_support import REPO, load_yaml_file, render, write_kustomization
from helm_render import HelmRefused, example_values
from helm_render import render as helm_render
from k8s_schemas import SchemaSet, installed_dir, validate

from compat_tests.apiserver import pipeline

LABEL = "functions.accelerator.b-com.com/"
NLB0 = "nlb0.accelerator.b-com.com"
VADD = "vadd.accelerator.b-com.com"
PLAIN = "accelerator.b-com.com"
"""The dra component's class: no function, never guarded."""
SCHEMAS = SchemaSet("1.36", installed_dir("1.36"))
EXAMPLES = REPO / "deploy" / "examples" / "programming"
COMPONENT = ("dra", "programming", "function-admission")
MOVED = """namespace: accelerators
namePrefix: pool-a-
transformers:
  - {follow}
"""


def chart_values(**admission: Any) -> dict[str, Any]:
    """The chart's programming example (nlb0) with the policy on, guarding the two other
    example classes as well: the catalogue the kustomize component ships."""
    values = example_values("programming")
    values["functionAdmission"] = {"enabled": True, "deviceClasses": [
        {"name": VADD}, {"name": "hello-world.accelerator.b-com.com"}], **admission}
    return values


@pytest.fixture(scope="module")
def renderings(kubectl, tmp_path_factory) -> dict[str, list[dict[str, Any]]]:
    root = tmp_path_factory.mktemp("function-admission")
    return {
        "kustomize": render(kubectl, write_kustomization(root / "plain", COMPONENT)),
        "kustomize-moved": render(kubectl, write_kustomization(root / "moved", COMPONENT,
                                                               MOVED)),
        "chart": helm_render(chart_values()),
        "chart-moved": helm_render(chart_values(), namespace="accelerators", release="pool-a"),
    }


HOME = {"kustomize": "kube-system", "kustomize-moved": "accelerators",
        "chart": "fpga-system", "chart-moved": "accelerators"}
"""Each rendering's install (release) namespace: where the catalogue and the DaemonSet are.
``chart`` is installed in a namespace of its own, as on the cluster where a fault was found."""


def render_at_home(kubectl: Any, root: Path) -> dict[str, list[dict[str, Any]]]:
    """The component and the chart, plain and moved, each installed at its :data:`HOME`."""
    return {
        "kustomize": render(kubectl, write_kustomization(root / "plain", COMPONENT)),
        "kustomize-moved": render(kubectl, write_kustomization(root / "moved", COMPONENT,
                                                               MOVED)),
        "chart": helm_render(chart_values(), namespace=HOME["chart"]),
        "chart-moved": helm_render(chart_values(), namespace=HOME["chart-moved"],
                                   release="pool-a"),
    }


def guarded(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects
            if o["metadata"].get("labels", {}).get("app.kubernetes.io/component")
            == "function-admission"]


def bindings(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The policy's two bindings: (the one reading the catalogue ConfigMap, the one without
    parameters, which reads the policy's own copy)."""
    found = [o for o in guarded(objects) if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    (live,) = [b for b in found if "paramRef" in b["spec"]]
    (rendered,) = [b for b in found if "paramRef" not in b["spec"]]
    return live, rendered


def parts(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any],
                                                  dict[str, Any]]:
    """(policy, the binding reading the catalogue, catalogue ConfigMap) of a rendering."""
    by_kind = {o["kind"]: o for o in guarded(objects)}
    assert sorted(by_kind) == ["ConfigMap", "ValidatingAdmissionPolicy",
                               "ValidatingAdmissionPolicyBinding"]
    assert len(guarded(objects)) == 4
    return by_kind["ValidatingAdmissionPolicy"], bindings(objects)[0], by_kind["ConfigMap"]


def schema_problems(obj: dict[str, Any]) -> list[str]:
    """What a 1.36 API server's schemas (and, for claims, its validation rules) refuse."""
    problems = validate(obj, SCHEMAS)
    if obj["kind"] == "ResourceClaim":
        problems += pipeline.validate(obj, model="1.36")
    return problems


def namespace(name: str, **grants: str) -> dict[str, Any]:
    """A Namespace as the API server has it (with its immutable name label), ``grants`` being
    class name -> the grant label's value."""
    labels = {"kubernetes.io/metadata.name": name, **{LABEL + c: v for c, v in grants.items()}}
    obj = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
    assert schema_problems(obj) == []
    return obj


def claim_spec(version: str, *classes: str, first_available: bool = False) -> dict[str, Any]:
    """A claim spec of ``version`` asking for one device of each class, as exact requests or
    as the subrequests of one firstAvailable request."""
    def exact(name: str, cls: str) -> dict[str, Any]:
        return ({"name": name, "deviceClassName": cls} if version == "v1beta1"
                else {"name": name, "exactly": {"deviceClassName": cls}})

    if first_available:
        subrequests = [{"name": f"option{i}", "deviceClassName": c}
                       for i, c in enumerate(classes)]
        return {"devices": {"requests": [{"name": "fpga", "firstAvailable": subrequests}]}}
    return {"devices": {"requests": [exact(f"fpga{i}", c) for i, c in enumerate(classes)]}}


def claim(version: str, *classes: str, first_available: bool = False,
          ns: str = "team-b") -> Request:
    obj = {"apiVersion": f"resource.k8s.io/{version}", "kind": "ResourceClaim",
           "metadata": {"name": "fpga", "namespace": ns},
           "spec": claim_spec(version, *classes, first_available=first_available)}
    assert schema_problems(obj) == [], obj
    return Request("CREATE", "resourceclaims", obj, ns)


def template(version: str, *classes: str, first_available: bool = False) -> Request:
    obj = {"apiVersion": f"resource.k8s.io/{version}", "kind": "ResourceClaimTemplate",
           "metadata": {"name": "fpga", "namespace": "team-b"},
           "spec": {"spec": claim_spec(version, *classes, first_available=first_available)}}
    assert schema_problems(obj) == [], obj
    return Request("CREATE", "resourceclaimtemplates", obj, "team-b")


def pod(containers: dict[str, dict[str, str]] | None = None,
        init: dict[str, dict[str, str]] | None = None, ns: str = "team-b") -> Request:
    """A Pod whose app container has ``containers`` as resources (requests/limits) and, when
    given, an init container with ``init``."""
    spec: dict[str, Any] = {"containers": [{"name": "app", "image": "registry.example.com/app"}]}
    if containers:
        spec["containers"][0]["resources"] = containers
    if init:
        spec["initContainers"] = [{"name": "setup", "image": "registry.example.com/setup",
                                   "resources": init}]
    obj = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "app", "namespace": ns},
           "spec": spec}
    assert schema_problems(obj) == [], obj
    return Request("CREATE", "pods", obj, ns)


def decide(objects: list[dict[str, Any]], request: Request,
           ns: dict[str, Any]) -> admission_policy.Decision:
    policy, _, _ = parts(objects)
    return admit_all(policy, bindings(objects), request, ns, objects)


RENDERINGS = ["kustomize", "kustomize-moved", "chart", "chart-moved"]


# --- rendering ------------------------------------------------------------------------------


def test_off_unless_asked_for(kubectl, tmp_path):
    objects = render(kubectl, write_kustomization(tmp_path, ("dra", "programming")))
    assert guarded(objects) == []
    assert guarded(helm_render(example_values("programming"))) == []
    assert guarded(helm_render({})) == []


@pytest.mark.parametrize("name", RENDERINGS)
def test_rendered_objects_are_valid_kubernetes_1_36_objects(renderings, name):
    for obj in renderings[name]:
        assert validate(obj, SCHEMAS) == [], obj["kind"]


@pytest.mark.parametrize("name", RENDERINGS)
def test_every_expression_and_message_parses(renderings, name):
    policy, _, _ = parts(renderings[name])
    found = admission_policy.expressions(policy)
    assert len(found) == 10  # seven variables, one match condition, a validation, its message
    for expression in found:
        admission_policy.program(expression)


def test_the_chart_lints_clean_with_the_policy_on():
    from helm_render import lint

    assert lint(chart_values()) == []


def test_the_parse_check_can_fail():
    with pytest.raises(celpy.CELParseError):
        admission_policy.program('variables.refused[0] + "')


@pytest.mark.parametrize("name", RENDERINGS)
def test_names_and_namespace_follow_the_install(renderings, name):
    policy, binding, catalogue = parts(renderings[name])
    moved = name.endswith("moved")
    home = "accelerators" if moved else "kube-system"
    assert catalogue["metadata"]["namespace"] == home
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert policy["metadata"]["name"].startswith("pool-a-" if moved else "accelerator-")
    rendered = bindings(renderings[name])[1]
    assert rendered["spec"]["policyName"] == policy["metadata"]["name"]
    assert rendered["metadata"]["name"] == binding["metadata"]["name"] + "-rendered"
    for obj in (policy, binding, rendered):  # cluster-scoped
        assert "namespace" not in obj["metadata"]
    ref = binding["spec"]["paramRef"]
    assert ref["namespace"] == home and ref["parameterNotFoundAction"] == "Allow"
    # The reference finds exactly the catalogue (kustomize by label, the chart by name).
    request = claim("v1", NLB0)
    assert admission_policy._params(binding, request, renderings[name]) == [catalogue]


def test_the_chart_policy_is_the_components(renderings):
    component, component_binding, component_catalogue = parts(renderings["kustomize"])
    chart, chart_binding, chart_catalogue = parts(renderings["chart"])
    assert chart["spec"] == component["spec"]
    assert component_catalogue["data"] == chart_catalogue["data"] == {
        NLB0: "b-com.com/nlb0", VADD: "", "hello-world.accelerator.b-com.com": ""}
    drop = ("paramRef",)
    assert {k: v for k, v in chart_binding["spec"].items() if k not in drop} == \
        {k: v for k, v in component_binding["spec"].items() if k not in drop}
    assert bindings(renderings["chart"])[1]["spec"] == bindings(renderings["kustomize"])[1]["spec"]


@pytest.mark.parametrize(("values", "why"), [
    ({"functionAdmission": {"enabled": True}}, "no function class to guard"),
    (chart_values(deviceClasses=[{"name": NLB0}]), "is listed already as programming"),
    ({"functionAdmission": {"enabled": True, "deviceClasses": [{"name": "a" * 64}]}},
     "functionAdmission"),
])
def test_the_chart_refuses_a_catalogue_that_cannot_work(values, why):
    with pytest.raises(HelmRefused, match=why):
        helm_render(values)


def test_a_class_name_no_label_can_hold_is_refused_with_programming_too():
    values = chart_values()
    values["programming"]["deviceClasses"][0]["name"] = "n" * 64 + ".example.com"
    with pytest.raises(HelmRefused, match="longer than 63 characters"):
        helm_render(values)


# --- what the policy admits and refuses -----------------------------------------------------


REFUSED = [
    ("claim v1", lambda: claim("v1", NLB0), NLB0),
    ("claim v1beta2", lambda: claim("v1beta2", NLB0), NLB0),
    ("claim v1beta1 (deviceClassName on the request)", lambda: claim("v1beta1", VADD), VADD),
    ("claim v1, second request", lambda: claim("v1", PLAIN, VADD), VADD),
    ("claim v1 firstAvailable", lambda: claim("v1", PLAIN, NLB0, first_available=True), NLB0),
    ("claim v1beta1 firstAvailable",
     lambda: claim("v1beta1", PLAIN, VADD, first_available=True), VADD),
    ("template v1", lambda: template("v1", NLB0), NLB0),
    ("template v1beta1", lambda: template("v1beta1", NLB0), NLB0),
    ("template v1 firstAvailable", lambda: template("v1", PLAIN, VADD, first_available=True),
     VADD),
    ("pod limits, extendedResourceName", lambda: pod({"limits": {"b-com.com/nlb0": "1"}}),
     NLB0),
    ("pod requests and limits", lambda: pod({"requests": {"b-com.com/nlb0": "1"},
                                             "limits": {"b-com.com/nlb0": "1"}}), NLB0),
    ("pod, the class's own resource name",
     lambda: pod({"limits": {f"deviceclass.resource.kubernetes.io/{VADD}": "1"}}), VADD),
    ("pod, init container only", lambda: pod(init={"limits": {"b-com.com/nlb0": "1"}}), NLB0),
]


@pytest.mark.parametrize("name", RENDERINGS)
@pytest.mark.parametrize(("case", "make", "cls"), REFUSED, ids=[c[0] for c in REFUSED])
def test_a_namespace_without_the_grant_is_refused(renderings, name, case, make, cls):
    request = make()
    decision = decide(renderings[name], request, namespace("team-b"))
    assert decision.matched and not decision.allowed, case
    # Both bindings refuse, with the same words: the catalogue and the policy's copy agree.
    message, again = decision.messages
    assert message == again
    assert f"FPGA function class (DeviceClass) {cls}" in message
    assert f"kubectl label namespace team-b {LABEL}{cls}=true" in message
    if request.resource == "pods" and cls == NLB0:
        assert "b-com.com/nlb0" in message


@pytest.mark.parametrize("name", RENDERINGS)
@pytest.mark.parametrize(("case", "make", "cls"), REFUSED, ids=[c[0] for c in REFUSED])
def test_a_namespace_with_the_grant_is_admitted(renderings, name, case, make, cls):
    decision = decide(renderings[name], make(), namespace("team-a", **{cls: "true"}))
    assert decision.matched and decision.allowed, (case, decision.messages)


@pytest.mark.parametrize("name", ["kustomize", "chart"])
@pytest.mark.parametrize(("case", "grants"), [
    ("no label", {}),
    ("label false", {NLB0: "false"}),
    ("label with another value", {NLB0: "yes"}),
    ("another class granted", {VADD: "true"}),
])
def test_only_the_grant_label_set_to_true_grants(renderings, name, case, grants):
    decision = decide(renderings[name], claim("v1", NLB0), namespace("team-b", **grants))
    assert not decision.allowed, case


@pytest.mark.parametrize("name", ["kustomize", "chart"])
def test_every_class_asked_for_needs_its_own_grant(renderings, name):
    both = claim("v1", NLB0, VADD)
    decision = decide(renderings[name], both, namespace("team-b", **{NLB0: "true"}))
    assert not decision.allowed and VADD in decision.messages[0]
    assert decide(renderings[name], both,
                  namespace("team-b", **{NLB0: "true", VADD: "true"})).allowed


ADMITTED = [
    ("claim of the plain class", lambda: claim("v1", PLAIN)),
    ("claim v1beta1 of the plain class", lambda: claim("v1beta1", PLAIN)),
    ("firstAvailable without a function class",
     lambda: claim("v1", PLAIN, PLAIN, first_available=True)),
    ("template of the plain class", lambda: template("v1", PLAIN)),
    ("pod asking for the plain resource", lambda: pod({"limits": {"b-com.com/accelerator": "1"}})),
    ("pod asking for the plain class by name",
     lambda: pod({"limits": {f"deviceclass.resource.kubernetes.io/{PLAIN}": "1"}})),
    ("pod without resources", lambda: pod()),
    ("pod with cpu only", lambda: pod({"requests": {"cpu": "100m"}}, init={"limits": {
        "memory": "64Mi"}})),
    ("pod with pod-level resources", lambda: pod_level({"limits": {"cpu": "1"}})),
]


def pod_level(resources: dict[str, dict[str, str]]) -> Request:
    """A Pod with pod-level resources (PodLevelResources, beta in 1.34)."""
    request = pod()
    obj = copy.deepcopy(dict(request.obj))
    obj["spec"]["resources"] = resources
    assert schema_problems(obj) == [], obj
    return Request("CREATE", "pods", obj, request.namespace)


@pytest.mark.parametrize("name", ["kustomize", "chart"])
def test_pod_level_resources_are_read_too(renderings, name):
    """The API server takes only cpu, memory and hugepages at pod level (the 1.36 field's
    documentation), so no such Pod gets this far today; should that change, it is refused."""
    asking = pod_level({"limits": {"b-com.com/nlb0": "1"}})
    assert not decide(renderings[name], asking, namespace("team-b")).allowed
    assert decide(renderings[name], asking, namespace("team-b", **{NLB0: "true"})).allowed


@pytest.mark.parametrize("name", ["kustomize", "chart"])
@pytest.mark.parametrize(("case", "make"), ADMITTED, ids=[c[0] for c in ADMITTED])
def test_objects_naming_no_function_class_are_admitted(renderings, name, case, make):
    decision = decide(renderings[name], make(), namespace("team-b"))
    assert decision.matched and decision.allowed, (case, decision.messages)


@pytest.mark.parametrize("name", ["kustomize", "chart"])
def test_kube_system_and_updates_are_left_alone(renderings, name):
    objects = renderings[name]
    in_system = claim("v1", NLB0, ns="kube-system")
    assert not decide(objects, in_system, namespace("kube-system")).matched
    update = claim("v1", NLB0)
    update = Request("UPDATE", update.resource, update.obj, update.namespace)
    assert not decide(objects, update, namespace("team-b")).matched
    # The rules do match the resource through every served version (Equivalent).
    assert decide(objects, claim("v1beta2", PLAIN), namespace("team-b")).matched


@pytest.mark.parametrize("name", ["kustomize", "chart"])
def test_the_fallback_message_names_the_label_too(renderings, name):
    policy, _, _ = parts(renderings[name])
    (validation,) = policy["spec"]["validations"]
    assert f"{LABEL}<class>=true" in " ".join(validation["message"].split())


def test_an_empty_catalogue_guards_nothing_the_policy_did_not_render(renderings):
    """Whoever may write ConfigMaps beside the catalogue can empty it: that lifts nothing
    the policy was rendered with (its own copy), only what was added in place."""
    policy, binding, catalogue = parts(renderings["kustomize"])
    empty = copy.deepcopy(catalogue)
    del empty["data"]
    asking = claim("v1", NLB0)
    assert admit(policy, binding, asking, namespace("team-b"), [empty]).allowed
    assert not admit_all(policy, bindings(renderings["kustomize"]), asking,
                         namespace("team-b"), [empty]).allowed


# --- quotas and documentation ---------------------------------------------------------------


QUOTAS = EXAMPLES / "quota" / "fpga-functions.yaml"


def test_quota_examples_count_each_function_class():
    classes = {o["metadata"]["name"] for path in EXAMPLES.glob("*.yaml")
               for o in load_yaml_file(path) if o["kind"] == "DeviceClass"}
    quotas = load_yaml_file(QUOTAS)
    counted = set()
    for quota in quotas:
        assert quota["kind"] == "ResourceQuota"
        assert validate(quota, SCHEMAS) == []
        for key in quota["spec"]["hard"]:
            cls, _, rest = key.partition(".deviceclass.resource.k8s.io/")
            assert rest == "devices" and cls in classes, key
            counted.add(cls)
    assert counted == classes
    kustomization = yaml.safe_load((EXAMPLES / "kustomization.yaml").read_text())
    assert not any("quota" in r for r in kustomization["resources"])  # applied per tenant


def test_the_guide_shows_the_label_the_policy_reads(renderings):
    policy, _, _ = parts(renderings["kustomize"])
    (refused,) = [v["expression"] for v in policy["spec"]["variables"]
                  if v["name"] == "refused"]
    assert f'"{LABEL}" + c' in refused
    for doc in (REPO / "docs" / "programming.md",
                REPO / "deploy" / "helm" / "accelerator-device-plugin" / "README.md"):
        text = Path(doc).read_text()
        assert f"kubectl label namespace team-a {LABEL}{NLB0}=true" in text, doc
        assert ".deviceclass.resource.k8s.io/devices" in text, doc
