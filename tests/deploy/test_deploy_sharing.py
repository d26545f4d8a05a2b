"""Shared devices as deployed: the ``sharing`` component gives serve ``--dra-share`` and
nothing else, and only over DRA; the example DeviceClasses (deploy/examples/sharing) and the
chart's ``sharing.deviceClasses`` select, per family, the devices published shared
(``allowMultipleAllocations``) that hold one function, and are valid objects of every release
with resource.k8s.io/v1, as is the example workload whose claims ask for contexts.

What the classes select is checked with a real CEL evaluator against pools the driver's own
code publishes. What a real scheduler does with consumable capacity, and what a real card
does with several users, only a real cluster shows (docs/sharing.md says which).
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_support import (
    REPO,
    container,
    env,
    load_yaml_file,
    minor,
    pod_spec,
    render,
    write_kustomization,
)
from helm_render import HelmRefused, of_kind
from helm_render import render as helm_render
from k8s_schemas import validate, validate_or_fall_back

from api_versions.resource_slices import slices_for
from compat_tests import cel_devices
from compat_tests.apiserver import models, pipeline
from compat_tests.fake_alveo import ALVEO_CARDS, add_alveo_card, load_xclbin
from compat_tests.fake_sysfs import OTHER_AFU_ID, FakeNode
from plugin.cli import config
from plugin.discovery.backends import make_backend
from plugin.serving.dra.inventory import pool_of
from value_types.devices import DeviceSet

EXAMPLES = REPO / "deploy" / "examples" / "sharing"
WORKLOAD = EXAMPLES / "workload" / "nlb0-workers.yaml"
DRIVER = config.DEFAULT_DRA_DRIVER
SHARE_VARIABLE = config._env("--dra-share")
FIRST_WITH_RESOURCE_V1 = "1.34"
ATTRIBUTES = f'device.attributes["{DRIVER}"]'
HELD = {"intel": "afuID", "alveo": "xclbinUUID"}
"""The attribute each shareable family publishes the function it holds in."""
HEX32 = re.compile(r"^[0-9a-f]{32}$")
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")

@pytest.fixture(scope="module")
def examples(kubectl: str) -> list[dict[str, Any]]:
    return render(kubectl, EXAMPLES)


@pytest.fixture(scope="module")
def workload() -> list[dict[str, Any]]:
    return load_yaml_file(WORKLOAD)


def _by_family(classes: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The classes by the family their third selector names."""
    return {c["spec"]["selectors"][2]["cel"]["expression"].split('"')[-2]: c for c in classes}


def _held(device_class: dict[str, Any]) -> str:
    """The function ID a class's fourth selector compares the held function with."""
    return str(device_class["spec"]["selectors"][3]["cel"]["expression"].split('"')[-2])


# --- the example DeviceClasses -------------------------------------------------------------


def test_the_kustomization_lists_every_example_class(examples):
    files = sorted(p for p in EXAMPLES.glob("*.yaml") if p.name != "kustomization.yaml")
    assert len(files) == 2
    from_files = [obj for path in files for obj in load_yaml_file(path)]
    assert sorted(o["metadata"]["name"] for o in examples) == sorted(
        o["metadata"]["name"] for o in from_files)
    assert {o["kind"] for o in examples} == {"DeviceClass"}


def test_each_class_selects_shared_devices_of_its_family_by_the_function_held(examples):
    """Driver, then shared, then family, then the held function (guarded by `in`): the
    scheduler stops at the first selector that does not match, so no other driver's or
    family's device reaches the attribute lookup, and a device without the attribute is a
    mismatch, never an error that would abort the allocation."""
    by_family = _by_family(examples)
    assert set(by_family) == set(HELD)
    for family, device_class in by_family.items():
        expressions = [s["cel"]["expression"] for s in device_class["spec"]["selectors"]]
        attribute = HELD[family]
        identity = _held(device_class)
        assert expressions == [
            f'device.driver == "{DRIVER}"',
            "device.allowMultipleAllocations == true",
            f'{ATTRIBUTES}.family == "{family}"',
            f'"{attribute}" in {ATTRIBUTES} && {ATTRIBUTES}.{attribute} == "{identity}"']
        # Written as the device publishes it: 32 lowercase hex digits, or a dashed UUID.
        assert (HEX32 if family == "intel" else UUID).match(identity), identity
        # A share never loads: no FpgaFunction, so the class works without --programming.
        assert "config" not in device_class["spec"]


def test_examples_validate_from_the_release_with_resource_v1(examples, workload, schema_sets):
    checked = []
    for schemas in schema_sets:
        if minor(schemas.version) < minor(FIRST_WITH_RESOURCE_V1):
            continue
        for obj in [*examples, *workload]:
            assert validate_or_fall_back(obj, schemas) == [], (
                schemas.version, obj["kind"], obj["metadata"]["name"])
        checked.append(schemas.version)
    assert checked[0] == FIRST_WITH_RESOURCE_V1


def _claim_of(template: dict[str, Any]) -> dict[str, Any]:
    """The ResourceClaim the template makes: its spec, copied unchanged."""
    return {"apiVersion": template["apiVersion"], "kind": "ResourceClaim",
            "metadata": {"name": "nlb0-workers-abc12-fpga-x7k2p", "namespace": "team-a"},
            "spec": copy.deepcopy(template["spec"]["spec"])}


@pytest.mark.parametrize("release", [m for m in models.MODELS
                                     if minor(m) >= minor(FIRST_WITH_RESOURCE_V1)])
def test_classes_and_claims_are_accepted_by_the_emulated_api_server(examples, workload,
                                                                    release):
    """The emulated server decodes against the OpenAPI a 1.36 server serves (narrowed to what
    the release knows) and applies its validation rules; on 1.34 and 1.35 the capacity
    request is dropped silently (DRAConsumableCapacity off), as those servers do."""
    (template,) = [o for o in workload if o["kind"] == "ResourceClaimTemplate"]
    for obj in [*examples, _claim_of(template)]:
        assert pipeline.validate(copy.deepcopy(obj), model=release) == [], (
            release, obj["kind"], obj["metadata"]["name"])


def test_the_checks_refuse_a_misspelt_or_malformed_capacity_request(workload, schema_sets):
    """The checks can fail: `requests` misspelt, or a count that is no quantity."""
    (template,) = [o for o in workload if o["kind"] == "ResourceClaimTemplate"]
    misspelt = copy.deepcopy(template)
    capacity = misspelt["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]
    capacity["request"] = capacity.pop("requests")
    newest = max(schema_sets, key=lambda s: minor(s.version))
    assert any("request" in e for e in validate(misspelt, newest))
    assert pipeline.validate(_claim_of(misspelt), model="1.36") != []
    malformed = _claim_of(template)
    malformed["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"][
        "contexts"] = "one"
    assert any("quantities" in e for e in pipeline.validate(malformed, model="1.36"))


def test_the_workload_is_three_pods_each_with_its_own_claim_for_one_context(examples,
                                                                          workload):
    (template,) = [o for o in workload if o["kind"] == "ResourceClaimTemplate"]
    (deployment,) = [o for o in workload if o["kind"] == "Deployment"]
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == _by_family(examples)["intel"][
        "metadata"]["name"]
    assert request["exactly"]["capacity"] == {"requests": {"contexts": "1"}}
    assert deployment["spec"]["replicas"] == 3
    spec = deployment["spec"]["template"]["spec"]
    assert spec["resourceClaims"] == [{"name": "fpga",
                                       "resourceClaimTemplateName": template["metadata"]["name"]}]
    (worker,) = spec["containers"]
    assert worker["resources"]["claims"] == [{"name": "fpga"}]
    assert "ACCELERATOR_SHARE_ID" in " ".join(worker["command"])


# --- what the classes select among published devices -----------------------------------------


def _published(root: Path, xclbin: str, shared: dict[str, int]) -> list[dict[str, Any]]:
    """The v1 slice devices serve publishes for a node with two Intel ports holding nlb0, one
    holding another AFU, an Alveo card holding ``xclbin`` and one holding none; ``shared``:
    device name -> the contexts it is published shared with."""
    node = FakeNode(root)
    node.add_opae_card("0000:5e:00.0")
    node.add_dfl_card("0000:d8:00.0")
    node.add_dfl_card("0000:3b:00.0", afu_id=OTHER_AFU_ID)
    for bdf in ALVEO_CARDS[:2]:
        add_alveo_card(node, bdf)
    load_xclbin(node, ALVEO_CARDS[0], xclbin)
    pool = pool_of(DRIVER, "fpga-node-1", DeviceSet.of(make_backend("auto", node.config()).scan()))
    pool = dataclasses.replace(pool, devices=tuple(
        dataclasses.replace(d, shared_contexts=shared.get(d.name, 0)) for d in pool.devices))
    (slice_obj,) = slices_for("v1", pool, 1, "node-uid", taints=True)
    devices: list[dict[str, Any]] = slice_obj["spec"]["devices"]
    return devices


def _selected(device_class: dict[str, Any], devices: list[dict[str, Any]]) -> set[str]:
    return {d["name"] for d in devices
            if cel_devices.selectors_match(device_class["spec"]["selectors"], d, DRIVER)}


def test_classes_select_only_shared_devices_holding_their_function(examples, tmp_path):
    nlb0_shared, nlb0_whole, other_afu = "pci-0000-5e-00-0", "pci-0000-d8-00-0", \
        "pci-0000-3b-00-0"
    vadd, empty = (f"pci-{bdf.replace(':', '-').replace('.', '-')}" for bdf in ALVEO_CARDS[:2])
    by_family = _by_family(examples)
    devices = _published(tmp_path, _held(by_family["alveo"]),
                         {nlb0_shared: 4, other_afu: 2, vadd: 3, empty: 2})
    by_name = {d["name"]: d for d in devices}
    assert by_name[nlb0_shared]["allowMultipleAllocations"] is True
    assert by_name[nlb0_shared]["capacity"]["contexts"]["value"] == "4"
    assert "allowMultipleAllocations" not in by_name[nlb0_whole]
    # nlb0 published whole, another AFU shared, an Alveo card: none is a share of nlb0.
    assert _selected(by_family["intel"], devices) == {nlb0_shared}
    # A card without an xclbin lacks xclbinUUID: a mismatch, not an aborted allocation.
    assert _selected(by_family["alveo"], devices) == {vadd}


# --- the sharing component -------------------------------------------------------------------


@pytest.fixture(scope="module")
def components(kubectl: str, tmp_path_factory: pytest.TempPathFactory
               ) -> dict[str, list[dict[str, Any]]]:
    root = tmp_path_factory.mktemp("sharing")
    return {name: render(kubectl, write_kustomization(root / name, parts)) for name, parts in
            {"dra": ("dra",), "dra+sharing": ("dra", "sharing")}.items()}


def test_component_adds_the_share_setting_and_nothing_else(components):
    dra, shared = components["dra"], components["dra+sharing"]
    added = {k: v for k, v in env(shared).items() if env(dra).get(k) != v}
    assert added == {SHARE_VARIABLE: "intel=image,alveo=image"}
    assert set(env(dra)) - set(env(shared)) == set()
    for part in ("volumeMounts", "ports", "securityContext"):
        assert container(shared).get(part) == container(dra).get(part), part
    assert pod_spec(shared)["volumes"] == pod_spec(dra)["volumes"]
    others = [sorted(repr(o) for o in objects if o["kind"] != "DaemonSet")
              for objects in (dra, shared)]
    assert others[0] == others[1], "the component adds no object: the classes are examples"


def test_serve_reads_the_components_setting(components, monkeypatch):
    for name in [n for n in os.environ if n.startswith(config.ENV_PREFIX)]:
        monkeypatch.delenv(name)
    for name, value in env(components["dra+sharing"]).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("NODE_NAME", "fpga-node-1")
    settings = config.parse(["serve"])
    assert config.settings_problem(settings) is None
    assert any(o.key == "dra-share" and o.source == f"env {SHARE_VARIABLE}"
               for o in settings.origins)


# --- the chart's sharing.deviceClasses -------------------------------------------------------


def _chart_values(examples: list[dict[str, Any]]) -> dict[str, Any]:
    """The example classes as chart values; the AFU ID written dashed and uppercase, as a
    GBS header or a tool may print it."""
    by_family = _by_family(examples)
    afu = _held(by_family["intel"]).upper()
    dashed = f"{afu[:8]}-{afu[8:12]}-{afu[12:16]}-{afu[16:20]}-{afu[20:]}"
    return {"config": {"api": "auto"}, "sharing": {"deviceClasses": [
        {"name": by_family["intel"]["metadata"]["name"], "function": {"afuID": dashed}},
        {"name": by_family["alveo"]["metadata"]["name"],
         "function": {"xclbinUUID": _held(by_family["alveo"])}}]}}


def test_the_chart_renders_the_example_classes(examples):
    rendered = {c["metadata"]["name"]: c for c in of_kind(helm_render(_chart_values(examples)),
                                                          "DeviceClass")}
    assert set(rendered) == {DRIVER} | {c["metadata"]["name"] for c in examples}
    for device_class in examples:
        chart = rendered[device_class["metadata"]["name"]]
        assert chart["spec"] == device_class["spec"]
        assert chart["metadata"]["labels"]["app.kubernetes.io/instance"]


def test_chart_classes_follow_the_driver_name_and_take_more_selectors(examples):
    values = _chart_values(examples)
    values["config"]["dra-driver-name"] = "fpga.example.com"
    extra = 'device.attributes["fpga.example.com"].card == "0"'
    values["sharing"]["deviceClasses"][0].update(
        {"selectors": [extra], "extendedResourceName": "b-com.com/nlb0-shared"})
    (_, intel, _) = of_kind(helm_render(values), "DeviceClass")
    expressions = [s["cel"]["expression"] for s in intel["spec"]["selectors"]]
    assert expressions[0] == 'device.driver == "fpga.example.com"'
    assert expressions[2] == 'device.attributes["fpga.example.com"].family == "intel"'
    assert expressions[4:] == [extra]
    assert intel["spec"]["extendedResourceName"] == "b-com.com/nlb0-shared"


def test_no_shared_class_by_default():
    assert [c["metadata"]["name"] for c in of_kind(helm_render({"config": {"api": "auto"}}),
                                                   "DeviceClass")] == [DRIVER]


def test_shared_classes_without_dra_are_refused_naming_the_value(examples):
    values = _chart_values(examples)
    values["config"]["api"] = "device-plugin"
    with pytest.raises(HelmRefused, match=r"sharing\.deviceClasses: only DRA"):
        helm_render(values)


def test_a_shared_class_name_taken_twice_is_refused(examples):
    values = _chart_values(examples)
    values["sharing"]["deviceClasses"][1]["name"] = DRIVER
    with pytest.raises(HelmRefused, match=r'sharing\.deviceClasses\[1\]\.name: '
                                          r'"accelerator\.b-com\.com" is already the name of '
                                          r"dra\.deviceClass"):
        helm_render(values)


@pytest.mark.parametrize("function", [
    {"agfiID": "agfi-0fcf87119b8e97bf3"},                       # AWS slots cannot be shared
    {"afuID": "d8424dc4a4a3c413f89e433683f9040b",
     "xclbinUUID": "5d0b1e8a-3c2f-4b6e-9a7d-1f2e3c4b5a69"},     # one function per class
    {"afuID": "d8424dc4a4a3c413f89e433683f9040b", "image": "nlb0.gbs"},   # nothing is loaded
    {},
])
def test_the_schema_refuses_what_cannot_be_shared(function):
    values = {"config": {"api": "auto"},
              "sharing": {"deviceClasses": [{"name": "x.accelerator.b-com.com",
                                             "function": function}]}}
    with pytest.raises(HelmRefused, match="/sharing/deviceClasses/0/function"):
        helm_render(values)


# --- the guide's own YAML --------------------------------------------------------------------

GUIDE = REPO / "docs" / "sharing.md"


def _guide_objects() -> list[dict[str, Any]]:
    return [yaml.safe_load(block) for block in
            re.findall(r"```yaml\n(.*?)```", GUIDE.read_text(), re.S)]


def test_the_guides_objects_are_what_a_136_api_server_accepts():
    """What a reader copies from docs/sharing.md: the slice, the class, the template's claim
    and the status the scheduler and the driver write, each checked as the emulated 1.36 API
    server would (the status as a status update of that claim)."""
    found = {o.get("kind", "status"): o for o in _guide_objects()
             if not o.get("apiVersion", "").startswith("kustomize.config.k8s.io/")}
    assert set(found) == {"ResourceSlice", "DeviceClass", "ResourceClaimTemplate", "status"}
    slice_obj = copy.deepcopy(found["ResourceSlice"])
    slice_obj["metadata"] = {"name": f"fpga-node-1-{DRIVER}-x7k2p"}
    assert pipeline.validate(slice_obj, model="1.36") == []
    assert slice_obj["spec"]["devices"][0]["allowMultipleAllocations"] is True
    assert pipeline.validate(copy.deepcopy(found["DeviceClass"]), model="1.36") == []
    claim = _claim_of(found["ResourceClaimTemplate"])
    claim["metadata"].update({"uid": "0b1d2c3b-9a8e-4f7d-b6c5-a4e3d2c1b0a9",
                              "resourceVersion": "1"})
    assert pipeline.validate(copy.deepcopy(claim), model="1.36") == []
    allocated = copy.deepcopy(claim)
    allocated["status"] = copy.deepcopy(found["status"]["status"])
    allocated["status"]["allocation"]["nodeSelector"] = {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": ["fpga-node-1"]}]}]}
    for entry in allocated["status"]["devices"]:
        for condition in entry["conditions"]:
            condition.update({"lastTransitionTime": "2026-11-27T22:00:00Z", "message": ""})
    assert pipeline.validate(allocated, model="1.36", old=claim, status=True) == []
    (result,) = allocated["status"]["allocation"]["devices"]["results"]
    assert result["shareID"] == allocated["status"]["devices"][0]["shareID"]
    assert result["consumedCapacity"] == {"contexts": "1"}


def test_the_guides_kustomization_renders_the_setting_it_patches(kubectl, tmp_path):
    """The kustomization docs/sharing.md shows, its paths pointing at this tree: the
    components build together, and its patch replaces the component's setting rather than
    adding a second variable of that name."""
    (kustomization,) = [o for o in _guide_objects() if o.get("kind") == "Kustomization"]
    text = yaml.safe_dump(kustomization).replace(
        "../k8s-accelerator-devplugin/", os.path.relpath(REPO, tmp_path) + "/")
    (tmp_path / "kustomization.yaml").write_text(text)
    objects = render(kubectl, tmp_path)
    names = [e["name"] for e in container(objects)["env"]]
    assert names.count(SHARE_VARIABLE) == 1
    assert env(objects)[SHARE_VARIABLE] == "intel=image,alveo=4"
    assert env(objects)["ACCELERATOR_DP_PROGRAMMING"] == "on"
