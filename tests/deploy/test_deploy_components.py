"""The kustomize Components under deploy/components: each overlay is the base plus its
component, any two compatible components combine in either order without one undoing the
other, combinations that cannot work fail to build, and a kustomization that moves or renames
the install keeps the ResourceSlice policy on the plugin's own ServiceAccount.

Every combination of COMBINATIONS (deploy_support) is also rendered, validated against each
release's schemas and checked for hardening with the shipped overlays, in
test_deploy_manifests.py.
"""

from __future__ import annotations

import itertools
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_support import (
    COMPONENTS,
    COMPONENTS_DIR,
    KUSTOMIZATIONS,
    OVERLAY_COMPONENTS,
    REPO,
    container,
    daemonset,
    env,
    env_from,
    kustomize,
    one,
    pod_spec,
    render,
    write_kustomization,
)
from test_deploy_dra import matched_user

from build_support import release
from plugin.cli import config

VERSION = release.package_version()
"""The version this tree declares (pyproject.toml), not the installed metadata's: a dev
venv's editable install keeps the version it was installed at."""

BACKENDS = {"intel", "alveo", "aws-units"}
EXCLUSIVE: list[tuple[set[str], str]] = [
    (BACKENDS, "one backend per DaemonSet"),
    ({"dra", "serviceaccount"}, "dra brings the serviceaccount component"),
    ({"aws-units", "afu"}, "units have nothing loaded to group by"),
    ({"legacy", "dra"}, "DRA's APIs are 1.34+, legacy is for 1.11 to 1.20"),
    ({"legacy", "events"}, "events.k8s.io/v1 is 1.19+, legacy is also for 1.11 to 1.18"),
    ({"legacy", "programming"}, "programming is DRA's, 1.34+"),
    ({"serviceaccount", "programming"}, "programming needs dra, which brings the account"),
    ({"aws-units", "programming"}, "units read no hardware: nothing to load"),
    ({"legacy", "function-admission"}, "admission policies are 1.30+, legacy is for 1.11 to 1.20"),
    ({"legacy", "sharing"}, "sharing is DRA's, 1.34+"),
    ({"serviceaccount", "sharing"}, "sharing needs dra, which brings the account"),
    ({"aws-units", "sharing"}, "AWS slots and units cannot be shared"),
]
"""Pairs that do not go together, and why."""
NEEDS = {"monitoring": ("metrics",), "events": ("serviceaccount",), "programming": ("dra",),
         "sharing": ("dra",)}
"""What a component cannot build without (listed before it); dra satisfies events too."""


def compatible(a: str, b: str) -> bool:
    return not any({a, b} <= group for group, _ in EXCLUSIVE)


def with_needs(chosen: tuple[str, ...]) -> tuple[str, ...]:
    """``chosen`` with what each needs listed first (events is content with dra's account)."""
    out: list[str] = []
    has_dra = "dra" in chosen or any("dra" in NEEDS.get(c, ()) for c in chosen)
    for component in chosen:
        for need in NEEDS.get(component, ()):
            if need == "serviceaccount" and has_dra:
                continue
            if need not in out and need not in chosen:
                out.append(need)
    # dra before events, metrics before monitoring: a component reads what came before.
    order = {"dra": 0, "serviceaccount": 0, "metrics": 0}
    return tuple(out) + tuple(sorted(chosen, key=lambda c: order.get(c, 1)))


PAIRS = [p for p in itertools.combinations(COMPONENTS, 2) if compatible(*p)]


# --- the components themselves -------------------------------------------------------------


def test_every_component_is_a_kustomize_component():
    assert set(COMPONENTS) >= {"cdi", "plugin-watcher", "dra", "metrics", "monitoring", "afu",
                               "alveo", "aws-units", "intel", "events", "serviceaccount",
                               "legacy", "programming", "function-admission", "sharing"}
    for name in COMPONENTS:
        (kustomization,) = yaml.safe_load_all((COMPONENTS_DIR / name / "kustomization.yaml")
                                              .read_text())
        assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1alpha1", name
        assert kustomization["kind"] == "Component", name


@pytest.mark.parametrize("overlay", [n for n in OVERLAY_COMPONENTS
                                     if KUSTOMIZATIONS[n][0].parts[-3:-1] == ("deploy",
                                                                              "overlays")])
def test_each_overlay_is_the_base_plus_its_component(kubectl, tmp_path, overlay):
    """The overlay paths users apply today render exactly what listing the component does."""
    path, _ = KUSTOMIZATIONS[overlay]
    by_hand = write_kustomization(tmp_path, OVERLAY_COMPONENTS[overlay])
    assert render(kubectl, path) == render(kubectl, by_hand)


# --- any two compatible components ---------------------------------------------------------


def _pod_parts(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """What components change in the pod, as order-free maps."""
    c = container(objects)
    spec = pod_spec(objects)
    return {
        "env": env(objects),
        "env_from": env_from(objects),
        "mounts": {m["mountPath"]: m for m in c.get("volumeMounts", [])},
        "volumes": {v["name"]: v for v in spec.get("volumes", [])},
        "ports": {p["name"]: p for p in c.get("ports", [])},
        "account": (spec.get("serviceAccountName"), spec.get("automountServiceAccountToken")),
        "annotations": daemonset(objects)["spec"]["template"]["metadata"].get("annotations"),
    }


def _changes(base: dict[str, Any], after: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per part, every key the component set, changed or removed (None)."""
    changed: dict[str, dict[str, Any]] = {}
    for part in ("env", "env_from", "mounts", "volumes", "ports"):
        keys = set(base[part]) | set(after[part])
        changed[part] = {k: after[part].get(k) for k in keys
                         if base[part].get(k) != after[part].get(k)}
    return changed


@pytest.fixture(scope="module")
def alone(kubectl, tmp_path_factory) -> dict[str, dict[str, Any]]:
    """Each component over the base (with what it needs), as _pod_parts; and the base's."""
    root = tmp_path_factory.mktemp("alone")
    found = {"": _pod_parts(render(kubectl, write_kustomization(root / "base", ())))}
    for name in COMPONENTS:
        found[name] = _pod_parts(render(kubectl, write_kustomization(root / name,
                                                                     with_needs((name,)))))
    return found


def test_pairs_cover_every_component_and_leave_out_only_the_exclusive_ones():
    assert {c for pair in PAIRS for c in pair} == set(COMPONENTS)
    left_out = set(itertools.combinations(COMPONENTS, 2)) - set(PAIRS)
    assert left_out == {p for p in itertools.combinations(COMPONENTS, 2)
                        if any(set(p) <= g for g, _ in EXCLUSIVE)}
    assert len(PAIRS) >= 50


@pytest.mark.parametrize("pair", PAIRS, ids=["+".join(p) for p in PAIRS])
def test_two_compatible_components_combine_without_conflict(kubectl, tmp_path, alone, pair,
                                                            monkeypatch):
    """Whatever two components both set, they set alike; listed in either order they render
    the same pod; and the pod has what each gives alone. Then serve accepts the settings."""
    a, b = pair
    base = alone[""]
    first = render(kubectl, write_kustomization(tmp_path / "ab", with_needs((a, b))))
    second = render(kubectl, write_kustomization(tmp_path / "ba", with_needs((b, a))))
    assert _pod_parts(first) == _pod_parts(second), "the order of the components matters"
    others = [sorted(repr(o) for o in objects if o["kind"] != "DaemonSet")
              for objects in (first, second)]
    assert others[0] == others[1]
    together = _pod_parts(first)
    changes_a, changes_b = _changes(base, alone[a]), _changes(base, alone[b])
    for part in changes_a:
        both = set(changes_a[part]) & set(changes_b[part])
        conflicts = {k: (changes_a[part][k], changes_b[part][k]) for k in both
                     if changes_a[part][k] != changes_b[part][k]}
        assert conflicts == {}, f"{a} and {b} set {part} differently: {conflicts}"
        expected = {**base[part], **changes_a[part], **changes_b[part]}
        expected = {k: v for k, v in expected.items() if v is not None}
        assert together[part] == expected, f"{part} of {a}+{b} is not both components' {part}"
    assert together["account"] in {alone[a]["account"], alone[b]["account"]}
    # The settings the pod would start with are ones serve accepts.
    for key, value in together["env"].items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("NODE_NAME", "fpga-node-1")
    assert config.settings_problem(config.parse(["serve"])) is None


@pytest.mark.parametrize(("chosen", "why"), [
    (("dra", "serviceaccount"), "already registered id"),
    (("events",), "nothing selected by ServiceAccount"),
    (("monitoring",), "nothing selected by Service"),
    # Programming is configured through DRA claims: never on a device plugin alone.
    (("programming",), "nothing selected by DeviceClass"),
    (("programming", "dra"), "nothing selected by DeviceClass"),
    # Only DRA allocates a device to several claims.
    (("sharing",), "nothing selected by DeviceClass"),
    (("metrics", "monitoring", "metrics"), "may not add resource"),
])
def test_combinations_that_cannot_work_fail_to_build(kubectl, tmp_path, chosen, why):
    """A component without what it needs, or an identity twice, is an error at build time,
    never a DaemonSet that starts without it."""
    done = kustomize(kubectl, write_kustomization(tmp_path, chosen))
    assert done.returncode != 0, chosen
    assert why in done.stderr


def test_two_backends_are_told_apart_by_the_pair_check(alone):
    """The conflict check can fail: two backend components set the backend differently."""
    changes = [_changes(alone[""], alone[b])["env"] for b in ("intel", "alveo")]
    assert changes[0]["ACCELERATOR_DP_BACKEND"] != changes[1]["ACCELERATOR_DP_BACKEND"]


# --- another namespace and a name prefix ---------------------------------------------------

MOVED = """namespace: accelerators
namePrefix: pool-a-
transformers:
  - {follow}
"""


@pytest.fixture(scope="module")
def moved(kubectl, tmp_path_factory) -> list[dict[str, Any]]:
    root = tmp_path_factory.mktemp("moved")
    return render(kubectl, write_kustomization(
        root, ("dra", "events", "metrics", "monitoring"), MOVED))


def _bound_accounts(objects: list[dict[str, Any]], role_kind: str = "ClusterRoleBinding"
                    ) -> dict[str, str]:
    """Binding name -> the user name of the one ServiceAccount it binds."""
    found = {}
    for binding in (o for o in objects if o["kind"] == role_kind):
        (subject,) = binding["subjects"]
        assert subject["kind"] == "ServiceAccount"
        found[binding["metadata"]["name"]] = \
            f"system:serviceaccount:{subject['namespace']}:{subject['name']}"
    return found


def _policy_user(objects: list[dict[str, Any]]) -> str:
    policy = one(objects, "ValidatingAdmissionPolicy")
    (condition,) = policy["spec"]["matchConditions"]
    return matched_user(condition["expression"])


def test_policy_follows_the_service_account_to_another_namespace_and_name(moved):
    account = one(moved, "ServiceAccount")["metadata"]
    assert (account["namespace"], account["name"]) == \
        ("accelerators", "pool-a-accelerator-device-plugin")
    user = f"system:serviceaccount:{account['namespace']}:{account['name']}"
    # Exactly the account the RBAC binds, which is exactly the one the pods run as.
    assert set(_bound_accounts(moved).values()) == {user}
    assert len(_bound_accounts(moved)) == 2  # DRA and Events
    assert _policy_user(moved) == user
    ds = daemonset(moved)
    assert ds["metadata"]["namespace"] == account["namespace"]
    assert pod_spec(moved)["serviceAccountName"] == account["name"]
    # The policy's binding still names the (renamed) policy.
    policy = one(moved, "ValidatingAdmissionPolicy")
    binding = one(moved, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    # Cluster-scoped objects carry no namespace (kustomize would give them one).
    for obj in moved:
        if obj["kind"] in ("ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
                           "ValidatingAdmissionPolicyBinding", "DeviceClass"):
            assert not obj["metadata"].get("namespace"), obj["kind"]
        else:
            assert obj["metadata"]["namespace"] == "accelerators", obj["kind"]


def test_without_the_transformer_the_policy_would_match_no_one(kubectl, tmp_path):
    """Why the transformer exists: kustomize renames the account and its bindings but not the
    account inside the CEL expression, which then matches no pod at all."""
    extra = MOVED.split("transformers:")[0]
    objects = render(kubectl, write_kustomization(tmp_path, ("dra",), extra))
    (user,) = set(_bound_accounts(objects).values())
    assert _policy_user(objects) != user
    assert _policy_user(objects) == \
        "system:serviceaccount:kube-system:accelerator-device-plugin"


def test_transformer_is_a_no_op_where_nothing_moved(kubectl, tmp_path, rendered):
    objects = render(kubectl, write_kustomization(tmp_path, ("dra",),
                                                  "transformers:\n  - {follow}\n"))
    assert objects == rendered["dra"]


def test_transformer_fails_the_build_without_a_policy(kubectl, tmp_path):
    done = kustomize(kubectl, write_kustomization(tmp_path, ("intel",),
                                                  "transformers:\n  - {follow}\n"))
    assert done.returncode != 0
    assert "ServiceAccount" in done.stderr


def _guide_kustomization(heading: str, tmp_path: Path) -> Path:
    """The first kustomization shown after ``heading`` in docs/deploying.md, with its
    `../k8s-accelerator-devplugin/` paths pointing at this tree, written to ``tmp_path``."""
    guide = (REPO / "docs" / "deploying.md").read_text()
    block = re.search(r"```yaml\n(.*?)```", guide[guide.index(heading):], re.S)
    assert block, f"no kustomization after {heading!r}"
    text = block[1].replace("../k8s-accelerator-devplugin/",
                            os.path.relpath(REPO, tmp_path) + "/")
    assert text != block[1]
    (tmp_path / "kustomization.yaml").write_text(text)
    return tmp_path


def test_the_guides_install_example_renders(kubectl, tmp_path, rendered):
    objects = render(kubectl, _guide_kustomization("**With kustomize.**", tmp_path))
    assert container(objects)["image"] == \
        f"registry.example.com/k8s-accelerator-devplugin:{VERSION}"
    values = env(objects)
    assert values["ACCELERATOR_DP_BACKEND"] == "intel"
    assert values["ACCELERATOR_DP_CDI"] == "true"
    assert values["ACCELERATOR_DP_REGISTRATION"] == "auto"
    assert values["ACCELERATOR_DP_METRICS_PORT"] == "8080"


def test_the_guides_renamed_install_is_the_one_checked_here(kubectl, tmp_path):
    """docs/deploying.md's example for another namespace and prefix renders what the tests
    above check: the policy on exactly the renamed account."""
    objects = render(kubectl, _guide_kustomization("### Another namespace, a name prefix",
                                                   tmp_path))
    account = one(objects, "ServiceAccount")["metadata"]
    assert account["namespace"] != "kube-system" and account["name"] != "accelerator-device-plugin"
    (user,) = set(_bound_accounts(objects).values())
    assert _policy_user(objects) == user
    assert MOVED.split("transformers:")[0].strip() in (REPO / "docs" / "deploying.md").read_text()


def test_two_pools_are_two_daemonsets_that_keep_to_their_own_pods(kubectl, tmp_path):
    """The guide's two hardware pools: distinct names, disjoint selectors, each metrics
    Service selecting its own pool's pods only, and no object rendered twice."""
    pools = {}
    for pool, backend, extra in (("a", "intel", ("metrics", "monitoring")),
                                 ("b", "alveo", ("metrics",))):
        pools[pool] = render(kubectl, write_kustomization(
            tmp_path / pool, (backend, *extra),
            f"namePrefix: pool-{pool}-\nlabels:\n  - pairs: {{accelerators.b-com.com/pool: "
            f"{pool}}}\n    includeSelectors: true\n"))
    ids = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"])
           for objects in pools.values() for o in objects]
    assert len(ids) == len(set(ids))
    pod_labels = {p: daemonset(o)["spec"]["template"]["metadata"]["labels"]
                  for p, o in pools.items()}
    for pool, objects in pools.items():
        selector = one(objects, "Service")["spec"]["selector"]
        assert [p for p, labels in pod_labels.items()
                if selector.items() <= labels.items()] == [pool]
        match = daemonset(objects)["spec"]["selector"]["matchLabels"]
        assert [p for p, labels in pod_labels.items() if match.items() <= labels.items()] == \
            [pool]
