"""The driver's side of the function guard, as the kustomize components and the chart render it.

With function admission on, the driver is told where the catalogue is (``--function-grants``:
the namespace of the catalogue ConfigMap, which it finds by the labels the policy's binding
finds it by) and the classes rendered (``--guarded-classes``: the policy's own copy), may
read Namespaces and list the ConfigMaps of that namespace; and the plain class leaves out the
devices it publishes ``functionGuarded``, judged here with a real CEL evaluator.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from deploy_support import REPO, load_yaml_file
from helm_render import example_values
from helm_render import render as helm_render
from k8s_schemas import validate
from test_function_admission import HOME, SCHEMAS, parts, render_at_home

from compat_tests.cel_devices import selectors_match
from plugin.cli import config
from plugin.programming.guarded import CATALOGUE_LABELS

DRIVER = "accelerator.b-com.com"


@pytest.fixture(scope="module")
def renderings(kubectl, tmp_path_factory) -> dict[str, list[dict[str, Any]]]:
    return render_at_home(kubectl, tmp_path_factory.mktemp("function-grants-driver"))


def settings_of(objects: list[dict[str, Any]]) -> config.Settings:
    """What ``serve`` makes of the rendered DaemonSet's variables and config file."""
    (daemonset,) = [o for o in objects if o["kind"] == "DaemonSet"]
    (container,) = [c for c in daemonset["spec"]["template"]["spec"]["containers"]
                    if c["name"] == "accelerator-device-plugin"]
    variables = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    files = [o for o in objects if o["kind"] == "ConfigMap" and "config.yaml" in o.get(
        "data", {})]
    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update({k: v for k, v in variables.items() if k != "ACCELERATOR_DP_CONFIG"})
        os.environ["NODE_NAME"] = "node-a"  # the downward API's
        with tempfile.TemporaryDirectory() as directory:
            path = Path(directory) / "config.yaml"
            path.write_text(files[0]["data"]["config.yaml"] if files else "{}\n")
            return config.parse(["serve", "--config", str(path)])
    finally:
        os.environ.clear()
        os.environ.update(saved)


def rules_of(objects: list[dict[str, Any]], kind: str) -> list[tuple[str | None, dict[str, Any]]]:
    """(namespace, rule) of every rule of ``kind`` (Role, ClusterRole) bound to the
    DaemonSet's service account."""
    (daemonset,) = [o for o in objects if o["kind"] == "DaemonSet"]
    account = (daemonset["spec"]["template"]["spec"]["serviceAccountName"],
               daemonset["metadata"]["namespace"])
    binding_kind = "RoleBinding" if kind == "Role" else "ClusterRoleBinding"
    roles = {(o["metadata"].get("namespace"), o["metadata"]["name"]): o
             for o in objects if o["kind"] == kind}
    found = []
    for binding in (o for o in objects if o["kind"] == binding_kind):
        if not any((s["name"], s.get("namespace")) == account for s in binding["subjects"]):
            continue
        role = roles[(binding["metadata"].get("namespace"), binding["roleRef"]["name"])]
        found += [(role["metadata"].get("namespace"), rule) for rule in role["rules"]]
    return found


@pytest.mark.parametrize("name", list(HOME))
def test_the_driver_is_pointed_at_the_catalogue_and_its_rendered_copy(renderings, name):
    objects = renderings[name]
    settings = settings_of(objects)
    _, _, catalogue = parts(objects)
    assert settings.function_grants == catalogue["metadata"]["namespace"] == HOME[name]
    assert settings.guarded_classes == tuple(sorted(catalogue["data"]))
    # The driver finds it by the labels the policy's binding finds it by.
    assert catalogue["metadata"]["labels"].items() >= CATALOGUE_LABELS.items()
    assert config.settings_problem(settings) is None


@pytest.mark.parametrize("name", list(HOME))
def test_the_driver_may_read_namespaces_and_list_the_catalogues_configmaps(renderings, name):
    objects = renderings[name]
    assert (None, {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]}) in \
        rules_of(objects, "ClusterRole")
    assert (HOME[name], {"apiGroups": [""], "resources": ["configmaps"],
                         "verbs": ["list"]}) in rules_of(objects, "Role")
    for obj in objects:
        assert validate(obj, SCHEMAS) == [], obj["kind"]


def plain_classes(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == "DeviceClass"
            and o["metadata"]["name"] in (DRIVER, f"pool-a-{DRIVER}")]


def device(**attributes: Any) -> dict[str, Any]:
    kinds = {bool: "bool", str: "string", int: "int"}
    return {"name": "pci-0000-af-00-1", "attributes": {
        k: {kinds[type(v)]: v} for k, v in {"family": "alveo", "programmable": True,
                                             **attributes}.items()}}


@pytest.mark.parametrize("name", ["kustomize", "kustomize-moved", "chart", "dra-only-chart"])
def test_the_plain_class_leaves_out_devices_holding_a_guarded_function(renderings, name):
    objects = renderings.get(name) or helm_render(example_values("dra-auto"))
    (plain,) = plain_classes(objects)
    assert plain["spec"]["extendedResourceName"] == "b-com.com/accelerator"
    selectors = plain["spec"]["selectors"]
    assert selectors_match(selectors, device(), DRIVER)
    assert selectors_match(selectors, device(functionGuarded=False), DRIVER)
    assert not selectors_match(selectors, device(functionGuarded=True), DRIVER)
    assert not selectors_match(selectors, device(), "other.example.com")


def test_the_shipped_plain_class_is_the_one_the_chart_renders():
    (shipped,) = load_yaml_file(REPO / "deploy" / "components" / "dra" / "cluster" /
                                "deviceclass.yaml")
    (rendered,) = plain_classes(helm_render(example_values("dra-auto")))
    assert rendered["spec"]["selectors"] == shipped["spec"]["selectors"]


def test_without_function_admission_the_driver_guards_nothing():
    objects = helm_render(example_values("programming"))
    settings = settings_of(objects)
    assert settings.function_grants is None and settings.guarded_classes == ()
    assert not [o for o in objects if o["kind"] == "Role"]


def test_the_components_three_copies_of_the_catalogue_agree(renderings):
    """grants.yaml, the policy's copy and the driver's (ACCELERATOR_DP_GUARDED_CLASSES)."""
    objects = renderings["kustomize"]
    policy, _, catalogue = parts(objects)
    (copy_,) = [v["expression"] for v in policy["spec"]["variables"]
                if v["name"] == "catalogue"]
    assert all(f'"{name}"' in copy_ for name in catalogue["data"])
    assert settings_of(objects).guarded_classes == tuple(sorted(catalogue["data"]))
