"""The Helm chart renders with Helm's own engine, lints clean, validates against the strict
schemas of every Kubernetes release its kubeVersion claims, and refuses wrong values by name."""

from __future__ import annotations

import json
import shutil
from typing import Any

import pytest
import yaml
from deploy_support import minor
from helm_render import (
    CHART,
    HelmRefused,
    example_names,
    example_values,
    lint,
    of_kind,
    one,
    render,
    validate_monitoring,
)
from k8s_schemas import SchemaSet, validate, validate_or_fall_back

from build_support import release

VERSION = release.package_version()
"""The version this tree declares (pyproject.toml), not the installed metadata's: a dev
venv's editable install keeps the version it was installed at."""

OLDEST = "1.21"
"""The chart's kubeVersion floor: DaemonSet maxSurge, as for deploy/base."""
DRA_OLDEST = "1.34"
"""resource.k8s.io/v1, which the DRA objects use."""
MONITORING_KINDS = {"ServiceMonitor", "PrometheusRule"}


def chart_yaml() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((CHART / "Chart.yaml").read_text())
    return loaded


def uses_dra(values: dict[str, Any]) -> bool:
    pools = values.get("nodePools", [])
    configs = [values.get("config", {})] + [p.get("config", {}) for p in pools]
    return any(c.get("api") in ("dra", "auto") for c in configs)


def oldest_for(values: dict[str, Any]) -> str:
    return DRA_OLDEST if uses_dra(values) else OLDEST


# --- metadata ------------------------------------------------------------------------------


def test_chart_is_v2_and_carries_the_package_version():
    meta = chart_yaml()
    assert meta["apiVersion"] == "v2"
    assert meta["name"] == "accelerator-device-plugin"
    assert meta["appVersion"] == VERSION
    assert meta["version"] == VERSION
    assert meta["kubeVersion"] == f">={OLDEST}.0-0"


def test_values_schema_is_draft_7_and_takes_the_defaults():
    import jsonschema

    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    jsonschema.Draft7Validator.check_schema(schema)
    assert schema["additionalProperties"] is False
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    assert list(jsonschema.Draft7Validator(schema).iter_errors(defaults)) == []


def test_examples_cover_what_operators_pick():
    assert {"default", "intel-cdi-plugin-watcher", "dra-auto", "two-pools", "other-namespace",
            "monitoring"} <= set(example_names())


# --- lint ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", example_names())
def test_every_example_passes_strict_lint(name):
    values = example_values(name)
    assert lint(values, kube_version=oldest_for(values)) == []


def test_lint_reports_a_broken_template(tmp_path):
    """The lint check can fail: a template that does not parse is an error."""
    broken = tmp_path / "accelerator-device-plugin"
    shutil.copytree(CHART, broken)
    (broken / "templates" / "service.yaml").write_text("{{ if }}\n")
    findings = lint({}, chart=broken)
    assert any(m["severity"] == 3 and "service.yaml" in m["error"] for m in findings), findings


# --- the Kubernetes schemas of every release the chart claims ------------------------------


def _problems(objects: list[dict[str, Any]], schemas: SchemaSet) -> dict[str, list[str]]:
    problems = {}
    for obj in objects:
        if obj["kind"] in MONITORING_KINDS:
            errors = validate_monitoring(obj)
        else:
            errors = validate_or_fall_back(obj, schemas)
        if errors:
            problems[f"{schemas.version} {obj['kind']} {obj['metadata']['name']}"] = errors[:5]
    return problems


@pytest.mark.parametrize("name", example_names())
def test_every_example_validates_from_its_oldest_kubernetes_to_the_newest(schema_sets, name):
    values = example_values(name)
    oldest = oldest_for(values)
    checked, problems = [], {}
    for schemas in schema_sets:
        if minor(schemas.version) < minor(oldest):
            continue
        checked.append(schemas.version)
        problems.update(_problems(render(values, kube_version=schemas.version), schemas))
    assert problems == {}
    newest = max((s.version for s in schema_sets), key=minor)
    assert checked[0] == oldest and checked[-1] == newest


def test_the_schemas_refuse_the_chart_below_its_kube_version(schema_sets):
    """Why 1.21: the 1.20 schemas refuse the DaemonSet's maxSurge (the check can fail)."""
    by_version = {s.version: s for s in schema_sets}
    (daemonset,) = of_kind(render({}), "DaemonSet")
    assert any("maxSurge" in e for e in validate(daemonset, by_version["1.20"]))


def test_structural_schemas_refuse_a_misspelt_monitoring_field():
    objects = render(example_values("monitoring"))
    monitor = one(objects, "ServiceMonitor")
    assert validate_monitoring(monitor) == []
    monitor["spec"]["endpoints"][0]["intervall"] = "30s"
    assert any("intervall" in e for e in validate_monitoring(monitor))
    rule = one(objects, "PrometheusRule")
    rule["spec"]["groups"][0]["rules"][0]["for"] = "ten minutes"
    assert any("for" in e for e in validate_monitoring(rule))


def test_helm_refuses_a_kubernetes_older_than_the_chart_claims():
    with pytest.raises(HelmRefused, match=r"kubeVersion: >=1\.21\.0-0 .*v1\.20\.0"):
        render({}, kube_version="1.20")


@pytest.mark.parametrize("name", ["dra-auto", "other-namespace"])
def test_dra_is_refused_below_1_34_naming_the_value(name):
    with pytest.raises(HelmRefused, match=r"config\.api: dra and auto need Kubernetes 1\.34"):
        render(example_values(name), kube_version="1.33")
    assert render(example_values(name), kube_version="1.34")


def test_device_plugin_renders_no_dra_object_on_any_claimed_release():
    objects = render({}, kube_version=OLDEST)
    assert {o["kind"] for o in objects} == {"DaemonSet", "ConfigMap", "Service"}


# --- wrong values, refused by name ---------------------------------------------------------

WRONG_VALUES = [
    ({"config": {"backend": "xilinx"}}, "/config/backend"),
    ({"config": {"api": "dra-only"}}, "/config/api"),
    ({"config": {"resource-mode": "per-afu"}}, "/config/resource-mode"),
    ({"config": {"resource-name": "accelerator"}}, "/config/resource-name"),
    ({"config": {"cdi": "yes"}}, "/config/cdi"),
    ({"config": {"events": "always"}}, "/config/events"),
    ({"config": {"dra-share": "aws=2"}}, "/config/dra-share"),
    ({"config": {"dra-share": "intel=4097"}}, "/config/dra-share"),
    ({"config": {"dra-share": ["alveo=0"]}}, "/config/dra-share"),
    ({"config": {"accel-nbunits": -1}}, "/config/accel-nbunits"),
    ({"config": {"socket-name": "kubelet.sock"}}, "/config/socket-name"),
    ({"config": {"replicas": "b-com.com/accelerator=65"}}, "/config/replicas"),
    ({"config": {"replicas": "accelerator=4"}}, "/config/replicas"),
    ({"nodePools": [{"name": "a", "config": {"replicas": "*=0"}}]},
     "/nodePools/0/config/replicas"),
    # Wiring the chart owns (a path or port the pod spec fixes) is not a config key.
    ({"config": {"metrics-port": 9000}}, "metrics-port"),
    ({"config": {"sysfs-root": "/sys"}}, "sysfs-root"),
    ({"config": {"no-such-flag": 1}}, "no-such-flag"),
    ({"metrics": {"port": 0}}, "/metrics/port"),
    ({"probes": {"port": "8081"}}, "/probes/port"),
    ({"probes": {"liveness": {"periodSeconds": 0}}}, "/probes/liveness/periodSeconds"),
    ({"image": {"digest": "latest"}}, "/image/digest"),
    ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ({"namespace": "Kube_System"}, "/namespace"),
    ({"nodePools": [{"name": "Intel_Pool"}]}, "/nodePools/0/name"),
    ({"nodePools": [{"nodeSelector": {"a": "b"}}]}, "/nodePools/0"),
    ({"nodePools": [{"name": "a", "config": {"backend": "fpga"}}]}, "/nodePools/0/config/backend"),
    ({"nodePools": [{"name": "a", "nodeSelector": {"vendor": True}}]},
     "/nodePools/0/nodeSelector/vendor"),
    ({"tolerations": [{"operator": "Sometimes"}]}, "/tolerations/0/operator"),
    ({"updateStrategy": {"type": "Recreate"}}, "/updateStrategy/type"),
    ({"replicas": 3}, "replicas"),
    # Programming: the chart owns its config keys, and refuses what cannot work or would
    # hand the pod the host's system directories.
    ({"config": {"programming": "on"}}, "programming"),
    ({"config": {"image-library": "/srv/images"}}, "image-library"),
    ({"programming": {"intelLoader": "opae"}}, "/programming/intelLoader"),
    ({"programming": {"maxImageBytes": 0}}, "/programming/maxImageBytes"),
    ({"programming": {"imageLibrary": {"hostPath": "images"}}},
     "/programming/imageLibrary/hostPath"),
    ({"programming": {"imageLibrary": {"hostPath": "/var/lib/../../etc"}}},
     "/programming/imageLibrary/hostPath"),
    ({"programming": {"toolsHostPaths": ["/usr/bin"]}}, "/programming/toolsHostPaths/0"),
    ({"programming": {"toolsHostPaths": ["/opt/xrt", "/"]}}, "/programming/toolsHostPaths/1"),
    ({"programming": {"fpgaconf": "fpgaconf"}}, "/programming/fpgaconf"),
    ({"programming": {"deviceClasses": [{"name": "Nlb0", "function": {
        "agfiID": "agfi-0fcf87119b8e97bf3"}}]}}, "/programming/deviceClasses/0/name"),
    ({"programming": {"deviceClasses": [{"name": "a", "function": {
        "agfiID": "agfi-0fcf87119b8e97bf3", "image": "a.bin"}}]}},
     "/programming/deviceClasses/0/function"),
    ({"programming": {"deviceClasses": [{"name": "a", "function": {
        "afuID": "d8424dc4a4a3c413f89e433683f9040b"}}]}}, "/programming/deviceClasses/0/function"),
    ({"programming": {"deviceClasses": [{"name": "a", "function": {
        "afuID": "d8424dc4", "image": "a.gbs"}}]}}, "/programming/deviceClasses/0/function"),
    ({"programming": {"deviceClasses": [{"name": "a", "function": {
        "afuID": "d8424dc4a4a3c413f89e433683f9040b", "xclbinUUID":
        "5d0b1e8a-3c2f-4b6e-9a7d-1f2e3c4b5a69", "image": "a.gbs"}}]}},
     "/programming/deviceClasses/0/function"),
    ({"programming": {"deviceClasses": [{"name": "a", "function": {
        "agfiID": "agfi-0fcf87119b8e97bf3", "bitstream": "x"}}]}},
     "/programming/deviceClasses/0/function"),
    ({"programming": {"deviceClasses": [{"name": "a", "extendedResourceName": "nlb0",
                                         "function": {"agfiID": "agfi-0fcf87119b8e97bf3"}}]}},
     "/programming/deviceClasses/0/extendedResourceName"),
]


@pytest.mark.parametrize(("values", "named"), WRONG_VALUES, ids=[n for _, n in WRONG_VALUES])
def test_schema_refuses_a_wrong_value_naming_it(values, named):
    with pytest.raises(HelmRefused) as refused:
        render(values)
    message = str(refused.value)
    assert "values don't meet the specifications of the schema" in message
    assert named in message, message


def test_lint_reports_the_wrong_value_too():
    findings = lint({"config": {"backend": "xilinx"}})
    assert any("/config/backend" in m["error"] for m in findings if m["severity"] == 3)


# --- image, checksum -----------------------------------------------------------------------


def _container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (only,) = one(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    return only


def test_image_tag_defaults_to_the_app_version_and_a_digest_pins_it():
    assert _container(render({}))["image"] == f"k8s-accelerator-devplugin:{VERSION}"
    tagged = render({"image": {"repository": "registry.example.com/adp", "tag": "1.2.3"}})
    assert _container(tagged)["image"] == "registry.example.com/adp:1.2.3"
    digest = "sha256:" + "ab" * 32
    pinned = render({"image": {"repository": "registry.example.com/adp", "digest": digest}})
    assert _container(pinned)["image"] == f"registry.example.com/adp@{digest}"


def _checksum(objects: list[dict[str, Any]]) -> str:
    annotations = one(objects, "DaemonSet")["spec"]["template"]["metadata"]["annotations"]
    return str(annotations["checksum/config"])


def test_a_config_change_rolls_the_pods_and_nothing_else_does():
    default = _checksum(render({}))
    assert _checksum(render({})) == default
    assert _checksum(render({"config": {"log-level": "debug"}})) != default
    # Not a setting of the plugin: the pods roll for it through the pod spec, not the file.
    assert _checksum(render({"resources": {"limits": {"memory": "200Mi"}}})) == default


def test_a_values_file_with_a_wrong_value_is_refused_naming_it(tmp_path):
    """As `helm install -f`: the file is read by Helm's own values parser."""
    import helm_python

    values_file = tmp_path / "values.yaml"
    values_file.write_text(
        "nodePools:\n  - name: intel\n    nodeSelector: {vendor: intel}\n"
        "    config:\n      backend: intel\n      device-list-strategy: cdi-only\n")
    values = helm_python.values_from_yaml(values_file.read_text())
    with pytest.raises(HelmRefused, match=r"at '/nodePools/0/config/device-list-strategy': "
                                          r"value must be one of"):
        render(values)
