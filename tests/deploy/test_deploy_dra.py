"""The dra overlay: the DaemonSet serves DRA where a node allows it, with the least access
to the API server a node-local DRA driver needs, confined to its own node's ResourceSlices,
and a DeviceClass that lets pods keep asking for b-com.com/accelerator (KEP-5004).

What only a real cluster shows (that the API server enforces the policy, that the scheduler
maps the extended resource, that a node switches API) is in docs/deploying.md; here the
rendered objects are read and checked against the schemas and the emulated API server.
"""

from __future__ import annotations

import copy
import os
import re
from typing import Any

import pytest
from deploy_support import (
    CDI_DIR,
    DRA_CLUSTER,
    DRA_STATE_DIR,
    KUSTOMIZATIONS,
    POD_RESOURCES_DIR,
    REGISTRY_DIR,
    REPO,
    container,
    daemonset,
    env,
    env_from,
    minor,
    one,
    pod_spec,
    render,
)
from k8s_schemas import (
    KINDS,
    OLD_VERSIONS,
    SchemaSet,
    schema_file_name,
    validate,
    validate_or_fall_back,
)

from compat_tests.apiserver import models, pipeline, strategy
from plugin.cli import config

DRIVER = config.DEFAULT_DRA_DRIVER
RESOURCE = config.DEFAULT_RESOURCE
RESOURCE_GROUP = "resource.k8s.io"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
FIRST_WITH_RESOURCE_V1 = "1.34"
FIRST_WITH_POLICY_V1 = "1.30"
DRA_OVERLAY, _ = KUSTOMIZATIONS["dra"]

MINIMUM_RULES = {
    (RESOURCE_GROUP, "resourceslices"): {"get", "list", "watch", "create", "update", "patch",
                                         "delete"},
    (RESOURCE_GROUP, "resourceclaims"): {"get", "list", "watch"},
    (RESOURCE_GROUP, "resourceclaims/status"): {"patch"},
    (RESOURCE_GROUP, "resourceclaims/driver"): {"associated-node:patch"},
    (RESOURCE_GROUP, "deviceclasses"): {"get", "list", "watch"},
    ("", "nodes"): {"get", "list", "watch"},
    ("events.k8s.io", "events"): {"create", "patch"},
}
"""(API group, resource) to verbs: what the DRA example driver asks for (its chart's
``templates/clusterrole.yaml``: the claim status write and, for Kubernetes 1.36's granular
authorization, the ``associated-node`` verb on ``resourceclaims/driver`` for the driver's name
only), with only the verbs this driver uses (a server-side apply is a PATCH, never an update),
plus reading DeviceClasses for ACCELERATOR_DP_API=auto, writing the Node's Events (on by
default with DRA), and listing and watching Nodes for the per-node label
accelerator.b-com.com/api (the pod watches its own Node by name)."""
NAMED = {(RESOURCE_GROUP, "resourceclaims/driver"): [DRIVER]}
"""The rules that must name their objects (resourceNames), and the names."""

DRA_ENV = {
    "ACCELERATOR_DP_API": "auto",
    "ACCELERATOR_DP_DRA_DRIVER_NAME": DRIVER,
    "ACCELERATOR_DP_DRA_STATE_DIR": DRA_STATE_DIR,
    "ACCELERATOR_DP_PLUGINS_REGISTRY_DIR": REGISTRY_DIR,
    "ACCELERATOR_DP_CDI": "true",
    "ACCELERATOR_DP_CDI_SPEC_DIR": CDI_DIR,
    "ACCELERATOR_DP_DEVICE_LIST_STRATEGY": "both",
    "ACCELERATOR_DP_POD_RESOURCES_SOCKET": f"{POD_RESOURCES_DIR}/kubelet.sock",
}
DRA_MOUNTS = {REGISTRY_DIR: "Directory", DRA_STATE_DIR: "DirectoryOrCreate",
              CDI_DIR: "DirectoryOrCreate", POD_RESOURCES_DIR: "DirectoryOrCreate"}
READ_ONLY_MOUNTS = {POD_RESOURCES_DIR}
"""The kubelet's PodResources socket is only read (as monitoring agents mount it)."""


@pytest.fixture(scope="module")
def dra(rendered: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return rendered["dra"]


@pytest.fixture(scope="module")
def cluster(kubectl: str) -> list[dict[str, Any]]:
    return render(kubectl, DRA_CLUSTER)


def account(objects: list[dict[str, Any]]) -> str:
    """The user name the API server gives the plugin's pods."""
    meta = one(objects, "ServiceAccount")["metadata"]
    return f"system:serviceaccount:{meta['namespace']}:{meta['name']}"


# --- what the overlay is made of -----------------------------------------------------------


def test_overlay_is_the_base_plus_the_cluster_objects(dra, cluster, rendered):
    """Applying cluster/ first, then the overlay, gives what the overlay alone gives."""
    assert [o for o in dra if o["kind"] != "DaemonSet"] == cluster
    assert "DaemonSet" not in [o["kind"] for o in cluster]
    for obj in dra:
        namespaced = obj["kind"] in ("ServiceAccount", "DaemonSet")
        assert (obj["metadata"].get("namespace") == "kube-system") is namespaced, obj["kind"]
        assert obj["metadata"]["labels"]["app.kubernetes.io/name"] == "accelerator-device-plugin"


def _without_dra(ds: dict[str, Any]) -> dict[str, Any]:
    """The dra DaemonSet with the overlay's additions taken out again."""
    ds = copy.deepcopy(ds)
    spec = ds["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    c["env"] = [e for e in c["env"] if e["name"] not in {*DRA_ENV, "NODE_NAME"}]
    names = {v["name"] for v in spec["volumes"] if v.get("hostPath", {}).get("path")
             in DRA_MOUNTS}
    spec["volumes"] = [v for v in spec["volumes"] if v["name"] not in names]
    c["volumeMounts"] = [m for m in c["volumeMounts"] if m["name"] not in names]
    del spec["serviceAccountName"]
    spec["automountServiceAccountToken"] = False
    return ds


def test_daemonset_is_the_base_one_with_only_the_dra_settings_added(dra, rendered):
    # Probes, resources, security context, update strategy: all as the base has them.
    assert _without_dra(daemonset(dra)) == daemonset(rendered["base"])


def test_daemonset_serves_dra_where_allowed_and_knows_its_node(dra):
    values = env(dra)
    assert {k: values.get(k) for k in DRA_ENV} == DRA_ENV
    # auto, never dra: a node that cannot take DRA keeps the device plugin.
    assert values["ACCELERATOR_DP_API"] == "auto"
    assert env_from(dra) == {"NODE_NAME": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    # The device-plugin side is the base's: same resource name for both APIs.
    assert values["ACCELERATOR_DP_RESOURCE_NAME"] == RESOURCE


def test_daemonset_mounts_the_registry_its_own_directory_and_the_cdi_specs(dra):
    spec = pod_spec(dra)
    volumes = {v["name"]: v["hostPath"] for v in spec["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m for m in container(dra)["volumeMounts"]}
    by_path = {source["path"]: (source["type"], mounts[name]) for name, source in
               volumes.items() if source["path"] in DRA_MOUNTS}
    assert {path: kind for path, (kind, _) in by_path.items()} == DRA_MOUNTS
    for path, (_, mount) in by_path.items():
        # At the host's own path: the kubelet dials the socket path the plugin registers,
        # and the runtime reads CDI specs that name host paths.
        assert mount["mountPath"] == path
        assert mount.get("readOnly", False) is (path in READ_ONLY_MOUNTS), path
        assert "mountPropagation" not in mount
    # Nothing else of /var/lib/kubelet/plugins: other drivers' sockets are not ours.
    others = [p for p in (s["path"] for s in volumes.values())
              if p.startswith("/var/lib/kubelet/plugins/") and p != DRA_STATE_DIR]
    assert others == []
    # The flags point where the volumes are.
    values = env(dra)
    for variable in ("ACCELERATOR_DP_DRA_STATE_DIR", "ACCELERATOR_DP_PLUGINS_REGISTRY_DIR",
                     "ACCELERATOR_DP_CDI_SPEC_DIR"):
        assert values[variable] in {m["mountPath"] for m in mounts.values()}, variable
    socket = values["ACCELERATOR_DP_POD_RESOURCES_SOCKET"]
    assert socket.rsplit("/", 1)[0] in {m["mountPath"] for m in mounts.values()}


def test_daemonset_state_dir_is_the_default_for_its_driver_name(dra):
    """Setting both explicitly keeps them in step with the hostPath; they also agree with
    what serve would pick by itself."""
    values = env(dra)
    assert values["ACCELERATOR_DP_DRA_DRIVER_NAME"] == DRIVER
    assert values["ACCELERATOR_DP_DRA_STATE_DIR"] == str(config.KUBELET_PLUGINS_DIR / DRIVER)


# --- RBAC ----------------------------------------------------------------------------------


def _rules(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        pairs = [(g, r) for g in rule["apiGroups"] for r in rule["resources"]]
        named = {NAMED.get(pair) is not None for pair in pairs}
        assert len(named) == 1, ("a rule naming objects grants nothing else", rule)
        if named == {True}:
            assert set(rule) == {"apiGroups", "resources", "verbs", "resourceNames"}, rule
            assert all(rule["resourceNames"] == NAMED[pair] for pair in pairs), rule
        else:
            assert set(rule) == {"apiGroups", "resources", "verbs"}, (
                "no resourceNames, nonResourceURLs or anything else", rule)
        for pair in pairs:
            granted.setdefault(pair, set()).update(rule["verbs"])
    return granted


def test_cluster_role_is_exactly_the_minimum(dra):
    role = one(dra, "ClusterRole")
    assert "aggregationRule" not in role
    granted = _rules(role)
    assert granted == MINIMUM_RULES
    named = {g for g, _ in granted} | {r for _, r in granted}
    assert "*" not in named | {v for verbs in granted.values() for v in verbs}
    # Of a claim only its status is written, and only by PATCH (server-side apply).
    assert {r for _, r in granted if r.startswith("resourceclaims")} == {
        "resourceclaims", "resourceclaims/status", "resourceclaims/driver"}
    assert [o["kind"] for o in dra if o["kind"] in ("Role", "RoleBinding")] == []


def test_rule_check_fails_on_one_verb_more():
    role = {"rules": [{"apiGroups": [g], "resources": [r], "verbs": sorted(v),
                       **({"resourceNames": NAMED[(g, r)]} if (g, r) in NAMED else {})}
                      for (g, r), v in MINIMUM_RULES.items()]}
    assert _rules(role) == MINIMUM_RULES
    role["rules"][1]["verbs"].append("update")
    assert _rules(role) != MINIMUM_RULES
    role["rules"][1]["resourceNames"] = ["x"]
    with pytest.raises(AssertionError):
        _rules(role)


def test_binding_gives_the_role_to_the_daemonsets_account_only(dra):
    binding = one(dra, "ClusterRoleBinding")
    role = one(dra, "ClusterRole")
    sa = one(dra, "ServiceAccount")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                  "kind": "ClusterRole", "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": sa["metadata"]["namespace"]}]
    assert pod_spec(dra)["serviceAccountName"] == sa["metadata"]["name"]
    assert sa["metadata"]["namespace"] == daemonset(dra)["metadata"]["namespace"]


# --- the ResourceSlice policy --------------------------------------------------------------


def cel_problems(expression: str) -> list[str]:
    """What makes ``expression`` fail to tokenize as CEL: an unclosed string literal or an
    unbalanced bracket. No CEL compiler exists for Python with the optional syntax
    (``[?...]``, ``.?``) these expressions use; the API server compiles them at create."""
    problems: list[str] = []
    closing = {")": "(", "]": "[", "}": "{"}
    stack: list[str] = []
    for token in re.finditer(r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'|["\']|[()\[\]{}]',
                             expression):
        text = token.group()
        if text in ("'", '"'):
            problems.append(f"unclosed string literal at {token.start()}")
        elif text in ("(", "[", "{"):
            stack.append(text)
        elif text in closing and (not stack or stack.pop() != closing[text]):
            problems.append(f"unbalanced {text!r} at {token.start()}")
    problems += [f"unclosed {b!r}" for b in stack]
    return problems


def test_cel_check_can_fail():
    assert cel_problems('a[?"b"][0].orValue("") == c.?d.orValue("")') == []
    assert cel_problems('a["b"][0') == ["unclosed '['"]
    assert cel_problems("a == 'b") == ["unclosed string literal at 5"]
    assert cel_problems("(a))") == ["unbalanced ')' at 3"]


def _policy_expressions(policy: dict[str, Any]) -> list[str]:
    spec = policy["spec"]
    return ([c["expression"] for c in spec["matchConditions"]]
            + [v["expression"] for v in spec["variables"]]
            + [v["expression"] for v in spec["validations"]]
            + [v["messageExpression"] for v in spec["validations"] if "messageExpression" in v])


def test_policy_matches_every_resourceslice_write_of_the_plugin_only(dra):
    policy = one(dra, "ValidatingAdmissionPolicy")
    spec = policy["spec"]
    assert policy["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == [RESOURCE_GROUP] and rule["resources"] == ["resourceslices"]
    assert sorted(rule["operations"]) == ["CREATE", "DELETE", "UPDATE"]
    # Every version the driver may write through (v1, v1beta2, v1beta1).
    assert rule["apiVersions"] == ["*"]
    assert spec["matchConstraints"].get("matchPolicy", "Equivalent") == "Equivalent"
    (condition,) = spec["matchConditions"]
    assert matched_user(condition["expression"]) == account(dra)


USER_CONDITION = re.compile(r'request\.userInfo\.username\s*==\s*((?:"[^"\\]*"\s*\+\s*)*"[^"\\]*")')


def matched_user(expression: str) -> str:
    """The one user name a match condition of the form `request.userInfo.username ==
    "a" + "b" + ...` lets in. Any other shape fails: the evaluation is exact for this
    shape and refuses to guess at others (the API server compiles the CEL itself)."""
    found = USER_CONDITION.fullmatch(expression.strip())
    assert found, f"not an exact user-name condition: {expression!r}"
    return "".join(re.findall(r'"([^"\\]*)"', found[1]))


def test_matched_user_reads_only_exact_user_name_conditions():
    assert matched_user('request.userInfo.username == "system:a:" + "b"') == "system:a:b"
    assert matched_user('request.userInfo.username == "x"') == "x"
    for other in ('request.userInfo.username.endsWith(":x")',
                  'request.userInfo.username == "a" || true',
                  'request.userInfo.username != "a"'):
        with pytest.raises(AssertionError):
            matched_user(other)


def test_policy_ties_each_slice_to_the_node_of_the_writers_token(dra):
    spec = one(dra, "ValidatingAdmissionPolicy")["spec"]
    for expression in _policy_expressions(one(dra, "ValidatingAdmissionPolicy")):
        assert cel_problems(expression) == [], expression
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    # The node comes from the token, never from the request body.
    user = variables["userNodeName"]
    assert f"request.userInfo.extra[?'{NODE_NAME_EXTRA}'][0]" in user
    assert ".orValue('')" in user
    # The slice's node, from the object written or, for a DELETE, the one being deleted.
    target = variables["objectNodeName"]
    assert 'request.operation == "DELETE"' in target
    assert re.search(r'\?\s*oldObject\.spec\.\?nodeName\.orValue\(""\)\s*:', target), target
    assert re.search(r':\s*object\.spec\.\?nodeName\.orValue\(""\)$', target), target
    validations = [v["expression"] for v in spec["validations"]]
    assert validations == ['variables.userNodeName != ""',
                           "variables.userNodeName == variables.objectNodeName"]
    for validation in spec["validations"]:
        assert validation.get("message") or validation.get("messageExpression")


def test_policy_binding_denies(dra):
    binding = one(dra, "ValidatingAdmissionPolicyBinding")
    policy = one(dra, "ValidatingAdmissionPolicy")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"],
                               "validationActions": ["Deny"]}


# --- the DeviceClass -----------------------------------------------------------------------


def test_device_class_maps_the_device_plugins_resource_name(dra, rendered):
    device_class = one(dra, "DeviceClass")
    assert device_class["apiVersion"] == f"{RESOURCE_GROUP}/v1"
    assert device_class["metadata"]["name"] == DRIVER
    spec = device_class["spec"]
    # The name pods already ask for, as the device plugin advertises it.
    assert spec["extendedResourceName"] == RESOURCE
    assert env(rendered["base"])["ACCELERATOR_DP_RESOURCE_NAME"] == RESOURCE
    # Every device of the driver but those holding a guarded function (what the second
    # selector admits: tests/deploy/test_function_grants_driver.py).
    selector, _guard = spec["selectors"]
    assert selector == {"cel": {"expression": f'device.driver == "{DRIVER}"'}}
    assert env(dra)["ACCELERATOR_DP_DRA_DRIVER_NAME"] == DRIVER
    assert "config" not in spec


@pytest.mark.parametrize("release", [m for m in models.MODELS
                                     if minor(m) >= minor(FIRST_WITH_RESOURCE_V1)])
def test_device_class_is_accepted_by_the_emulated_api_server(dra, release):
    # Decoding (strict) and the server's rules: a valid extended resource name, no
    # namespace on a cluster-scoped object, a DNS-subdomain name.
    assert pipeline.validate(one(dra, "DeviceClass"), model=release) == []


def test_extended_resource_name_needs_the_gate_before_1_36(dra):
    """What the DeviceClass comment and the guide say: 1.34 and 1.35 drop the field unless
    DRAExtendedResource is on; 1.36 keeps it by default."""
    def stored(release: str, gates: dict[str, bool] | None = None) -> dict[str, Any]:
        obj = copy.deepcopy(one(dra, "DeviceClass"))
        strategy.drop_disabled_fields("deviceclasses", obj, None,
                                      models.load_model(release, feature_gates=gates))
        return obj["spec"]

    for release in ("1.34", "1.35"):
        assert "extendedResourceName" not in stored(release)
        assert stored(release, {"DRAExtendedResource": True})["extendedResourceName"] == RESOURCE
    for release in ("1.36", "1.37"):
        assert stored(release)["extendedResourceName"] == RESOURCE


# --- schemas -------------------------------------------------------------------------------

NEEDS = {"DeviceClass": FIRST_WITH_RESOURCE_V1, "ValidatingAdmissionPolicy": FIRST_WITH_POLICY_V1,
         "ValidatingAdmissionPolicyBinding": FIRST_WITH_POLICY_V1}
"""The first release with the API version each kind is written in; the rest is older than
every release the other overlays are checked against."""


def test_each_object_validates_from_the_release_that_has_its_api(dra, schema_sets):
    """The overlay as a whole needs resource.k8s.io/v1 (1.34+, checked with every overlay in
    test_deploy_manifests); its DaemonSet, account and RBAC are valid from 1.21, and the
    policy from 1.30, so they can be reused by hand where DRA is enabled on older servers."""
    checked = set()
    for schemas in schema_sets:
        if minor(schemas.version) < 21:
            continue
        for obj in dra:
            if schemas.version in OLD_VERSIONS and \
                    schema_file_name(obj).removesuffix(".json") not in KINDS:
                continue  # the cached 1.11-1.24 schemas hold only the kinds of the base
            errors = validate_or_fall_back(obj, schemas)
            if minor(schemas.version) >= minor(NEEDS.get(obj["kind"], "1.21")):
                assert errors == [], (schemas.version, obj["kind"], errors[:3])
                checked.add((obj["kind"], schemas.version))
            else:
                # Why the overlay's oldest release is 1.34: before, the API does not exist.
                assert errors, (schemas.version, obj["kind"])
    assert ("DeviceClass", FIRST_WITH_RESOURCE_V1) in checked
    assert ("DaemonSet", "1.21") in checked and ("ClusterRole", "1.25") in checked


def test_schemas_reject_a_misspelled_device_class_field(dra, schema_sets):
    device_class = copy.deepcopy(one(dra, "DeviceClass"))
    device_class["spec"]["extendedResourceNames"] = device_class["spec"].pop(
        "extendedResourceName")
    newer = [s for s in schema_sets if minor(s.version) >= minor(FIRST_WITH_RESOURCE_V1)]
    assert newer
    for schemas in newer:
        assert any("extendedResourceNames" in e for e in validate(device_class, schemas))
    assert pipeline.validate(device_class, model="1.36") != []


def test_fallback_to_the_emulated_api_server_where_a_schema_is_missing(dra, tmp_path):
    """kubernetes-validate releases have lacked resource.k8s.io kinds; the fallback
    checks them against the 1.36 OpenAPI schemas of compat_tests/apiserver instead."""
    device_class = one(dra, "DeviceClass")
    for release in ("1.34", "1.36"):
        empty = SchemaSet(release, tmp_path)
        assert validate(device_class, empty)[0].startswith("no schema ")
        assert validate_or_fall_back(device_class, empty) == []
    broken = copy.deepcopy(device_class)
    broken["spec"]["extendedResourceName"] = "accelerator"  # no domain: not an extended name
    # 1.36 keeps the field (DRAExtendedResource on by default) and so checks it.
    assert any("extendedResourceName" in e for e in validate_or_fall_back(broken, empty))
    # A release that does not have resource.k8s.io/v1 at all says so.
    assert "resource.k8s.io/v1" in " ".join(
        validate_or_fall_back(device_class, SchemaSet("1.33", tmp_path)))
    # Other groups keep their missing-schema error: nothing to fall back to.
    policy = one(dra, "ValidatingAdmissionPolicy")
    assert validate_or_fall_back(policy, empty) == validate(policy, empty)


# --- the guide -----------------------------------------------------------------------------


def test_the_guides_pacing_kustomization_renders_the_overlay_with_on_delete(
        kubectl, dra, schema_sets, tmp_path):
    """docs/deploying.md tells operators to pace the move with this kustomization."""
    guide = (REPO / "docs" / "deploying.md").read_text()
    pacing = guide[guide.index("**Pacing.**"):]
    block = re.search(r"```yaml\n(.*?)```", pacing, re.S)
    assert block, "the Pacing paragraph lost its kustomization"
    text = re.sub(r"^(\s+- )\S*deploy/overlays/dra(\s.*)?$",
                  lambda m: m[1] + os.path.relpath(DRA_OVERLAY, tmp_path), block[1],
                  count=1, flags=re.M)
    assert text != block[1]
    (tmp_path / "kustomization.yaml").write_text(text)
    paced = render(kubectl, tmp_path)
    assert daemonset(paced)["spec"]["updateStrategy"] == {"type": "OnDelete"}
    # Nothing else differs from the overlay, and the result is a valid DaemonSet.
    assert [o for o in paced if o["kind"] != "DaemonSet"] == \
        [o for o in dra if o["kind"] != "DaemonSet"]
    newest = max(schema_sets, key=lambda s: minor(s.version))
    assert validate(daemonset(paced), newest) == []
