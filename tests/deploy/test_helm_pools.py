"""Node pools never share a node, and a release in another namespace keeps the ResourceSlice
policy and the RBAC on its own service account."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from helm_render import HelmRefused, example_values, of_kind, one, render

GLOBAL = {"kubernetes.io/os": "linux", "accelerators.b-com.com/fpga": "true"}


# --- where a DaemonSet's pods may run -------------------------------------------------------


def _expression_holds(expression: dict[str, Any], labels: dict[str, str]) -> bool:
    key, operator = expression["key"], expression["operator"]
    values = expression.get("values", [])
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":  # also true where the node lacks the label
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    raise AssertionError(f"operator {operator} not modelled")


def schedulable(daemonset: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether the scheduler may place the DaemonSet's pod on a node with ``labels``:
    nodeSelector and required node affinity (terms ORed, expressions ANDed)."""
    spec = daemonset["spec"]["template"]["spec"]
    if any(labels.get(k) != v for k, v in spec.get("nodeSelector", {}).items()):
        return False
    required = (spec.get("affinity", {}).get("nodeAffinity", {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if not required:
        return True
    return any(all(_expression_holds(e, labels) for e in term.get("matchExpressions", []))
               for term in required["nodeSelectorTerms"])


def nodes(objects: list[dict[str, Any]]) -> list[dict[str, str]]:
    """Every combination of the labels any DaemonSet selects or excludes on, each label
    absent or at any value named, plus one more value nobody names."""
    choices: dict[str, set[str]] = {}
    for ds in of_kind(objects, "DaemonSet"):
        spec = ds["spec"]["template"]["spec"]
        for key, value in spec.get("nodeSelector", {}).items():
            choices.setdefault(key, set()).add(value)
        required = (spec.get("affinity", {}).get("nodeAffinity", {})
                    .get("requiredDuringSchedulingIgnoredDuringExecution", {}))
        for term in required.get("nodeSelectorTerms", []):
            for expression in term.get("matchExpressions", []):
                choices.setdefault(expression["key"], set()).update(expression.get("values", []))
    keys = sorted(choices)
    options = [[None, "other", *sorted(choices[k])] for k in keys]
    return [{k: v for k, v in zip(keys, combo, strict=True) if v is not None}
            for combo in itertools.product(*options)]


def placement(objects: list[dict[str, Any]]) -> dict[tuple[tuple[str, str], ...], list[str]]:
    """For every node of ``nodes``: the DaemonSets whose pods it may run."""
    daemonsets = of_kind(objects, "DaemonSet")
    return {tuple(sorted(n.items())): [ds["metadata"]["name"] for ds in daemonsets
                                       if schedulable(ds, n)]
            for n in nodes(objects)}


def test_the_placement_check_finds_two_daemonsets_on_one_node():
    """The check can fail: two DaemonSets whose selectors overlap share a node."""
    a = {"metadata": {"name": "a"}, "kind": "DaemonSet",
         "spec": {"template": {"spec": {"nodeSelector": {"x": "1"}}}}}
    b = {"metadata": {"name": "b"}, "kind": "DaemonSet",
         "spec": {"template": {"spec": {"nodeSelector": {"y": "1"}}}}}
    assert ["a", "b"] in placement([a, b]).values()


# --- pools ---------------------------------------------------------------------------------


def test_two_pools_are_two_daemonsets_and_configmaps_with_their_own_settings():
    objects = render(example_values("two-pools"))
    names = [ds["metadata"]["name"] for ds in of_kind(objects, "DaemonSet")]
    assert names == ["accelerator-device-plugin-intel", "accelerator-device-plugin-alveo"]
    assert [c["metadata"]["name"] for c in of_kind(objects, "ConfigMap")] == [
        f"{n}-config" for n in names]
    selectors = [ds["spec"]["selector"]["matchLabels"] for ds in of_kind(objects, "DaemonSet")]
    assert selectors[0] != selectors[1], "each DaemonSet owns only its pods"
    for ds in of_kind(objects, "DaemonSet"):
        template = ds["spec"]["template"]
        assert ds["spec"]["selector"]["matchLabels"].items() <= template["metadata"][
            "labels"].items()


def test_two_pools_have_disjoint_affinity():
    objects = render(example_values("two-pools"))
    intel, alveo = of_kind(objects, "DaemonSet")
    for ds, other in ((intel, "amd"), (alveo, "intel")):
        (term,) = ds["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert {"key": "accelerators.b-com.com/vendor", "operator": "NotIn",
                "values": [other]} in term["matchExpressions"]
    where = placement(objects)
    assert all(len(on) <= 1 for on in where.values()), where
    # Each labelled FPGA node gets its pool's plugin.
    intel_node = tuple(sorted({**GLOBAL, "accelerators.b-com.com/vendor": "intel"}.items()))
    amd_node = tuple(sorted({**GLOBAL, "accelerators.b-com.com/vendor": "amd"}.items()))
    assert where[intel_node] == ["accelerator-device-plugin-intel"]
    assert where[amd_node] == ["accelerator-device-plugin-alveo"]


def test_the_pool_without_a_selector_takes_every_fpga_node_the_others_do_not():
    objects = render(example_values("pools-with-default"))
    where = placement(objects)
    assert all(len(on) <= 1 for on in where.values()), where
    for node, on in where.items():
        labels = dict(node)
        if any(labels.get(k) != v for k, v in GLOBAL.items()):
            assert on == [], "never on a node without the global labels"
            continue
        expected = {"f1.2xlarge": "f1-small", "f1.4xlarge": "f1-large"}.get(
            labels.get("node.kubernetes.io/instance-type", ""), "other")
        assert on == [f"accelerator-device-plugin-{expected}"], labels


def test_pools_keep_the_users_own_affinity_terms():
    values = example_values("two-pools")
    values["nodePools"][0]["affinity"] = {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
        ]}}}
    intel = of_kind(render(values), "DaemonSet")[0]
    terms = intel["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    exclusion = {"key": "accelerators.b-com.com/vendor", "operator": "NotIn", "values": ["amd"]}
    assert [t["matchExpressions"] for t in terms] == [
        [{"key": "zone", "operator": "In", "values": [zone]}, exclusion] for zone in "ab"]


def test_pool_settings_override_the_global_ones():
    objects = render({"config": {"log-level": "debug"}, **example_values("two-pools")})
    intel, alveo = of_kind(objects, "DaemonSet")
    alveo_spec = alveo["spec"]["template"]["spec"]
    assert alveo_spec["containers"][0]["resources"]["limits"]["memory"] == "192Mi"
    assert intel["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"][
        "memory"] == "128Mi"
    assert alveo_spec["tolerations"] == intel["spec"]["template"]["spec"]["tolerations"]


REFUSED_POOLS = [
    # Two pools whose selectors use different labels: a node with both would get two.
    ([{"name": "a", "nodeSelector": {"vendor": "intel"}},
      {"name": "b", "nodeSelector": {"card": "alveo"}}],
     r'nodePools: "a" \(own nodeSelector {"vendor":"intel"}\) and "b" .* may select the same'),
    # One pool's selector contains the other's: every node of the larger set is in both.
    ([{"name": "a", "nodeSelector": {"vendor": "intel"}},
      {"name": "b", "nodeSelector": {"vendor": "intel", "gen": "2"}}],
     r"may select the same node"),
    # Two pools without a selector of their own.
    ([{"name": "a"}, {"name": "b", "nodeSelector": {"accelerators.b-com.com/fpga": "true"}}],
     r"nodePools: a, b have no nodeSelector of their own"),
    ([{"name": "a", "nodeSelector": {"x": "1"}}, {"name": "a", "nodeSelector": {"x": "2"}}],
     r'nodePools\[1\]\.name: "a" is used by an earlier pool'),
    ([{"name": "a", "config": {"dra-driver-name": "other.example.com"}}],
     r"nodePools\[0\]\.config\.dra-driver-name: the driver name is cluster-wide"),
    ([{"name": "a", "config": {"api": "auto", "resource-name": "example.com/fpga"}}],
     r"nodePools\[0\]\.config\.resource-name: a pool with api \"auto\" serves the resource"),
]


@pytest.mark.parametrize(("pools", "message"), REFUSED_POOLS)
def test_pools_that_could_share_a_node_are_refused_by_name(pools, message):
    with pytest.raises(HelmRefused, match=message):
        render({"nodePools": pools})


def test_dra_without_cdi_is_refused_naming_the_value():
    with pytest.raises(HelmRefused, match=r"config\.cdi: false with api \"auto\""):
        render({"config": {"api": "auto", "cdi": False}})


def test_without_pools_one_daemonset_for_every_fpga_node():
    objects = render({})
    (ds,) = of_kind(objects, "DaemonSet")
    assert ds["metadata"]["name"] == "accelerator-device-plugin"
    assert ds["spec"]["template"]["spec"]["nodeSelector"] == GLOBAL
    assert "affinity" not in ds["spec"]["template"]["spec"]


# --- another namespace ----------------------------------------------------------------------


def _namespaced(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "DeviceClass",
                      "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    return [o for o in objects if o["kind"] not in cluster_scoped]


def _check_account_flows(objects: list[dict[str, Any]], namespace: str, account: str) -> None:
    assert {o["metadata"]["namespace"] for o in _namespaced(objects)} == {namespace}
    sa = one(objects, "ServiceAccount")
    assert (sa["metadata"]["namespace"], sa["metadata"]["name"]) == (namespace, account)
    binding = one(objects, "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account,
                                    "namespace": namespace}]
    assert binding["roleRef"]["name"] == one(objects, "ClusterRole")["metadata"]["name"]
    (condition,) = one(objects, "ValidatingAdmissionPolicy")["spec"]["matchConditions"]
    assert condition["expression"] == (
        f'request.userInfo.username == "system:serviceaccount:{namespace}:{account}"')
    pod = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account


def test_release_namespace_flows_into_binding_and_policy():
    objects = render(example_values("dra-auto"), namespace="accel-system")
    _check_account_flows(objects, "accel-system", "accelerator-device-plugin")


def test_namespace_value_and_account_name_flow_into_binding_and_policy():
    # The example's namespace value wins over the release's.
    objects = render(example_values("other-namespace"), namespace="default")
    _check_account_flows(objects, "fpga-system", "fpga-plugin")


def test_the_account_check_fails_where_the_policy_names_another_namespace():
    """What the kustomize overlay does with `namespace:` alone, caught by the same check."""
    objects = render(example_values("dra-auto"), namespace="accel-system")
    policy = one(objects, "ValidatingAdmissionPolicy")
    policy["spec"]["matchConditions"][0]["expression"] = (
        'request.userInfo.username == "system:serviceaccount:kube-system:'
        'accelerator-device-plugin"')
    with pytest.raises(AssertionError):
        _check_account_flows(objects, "accel-system", "accelerator-device-plugin")


def test_an_existing_account_is_named_but_not_created():
    values = {**example_values("dra-auto"),
              "serviceAccount": {"create": False, "name": "fpga-plugin"}}
    objects = render(values, namespace="accel-system")
    assert of_kind(objects, "ServiceAccount") == []
    assert one(objects, "ClusterRoleBinding")["subjects"][0]["name"] == "fpga-plugin"
    assert one(objects, "DaemonSet")["spec"]["template"]["spec"][
        "serviceAccountName"] == "fpga-plugin"
