"""The metrics and monitoring components: a Service Prometheus finds every plugin pod
through, a ServiceMonitor that scrapes it, and alerts whose PromQL Prometheus's own promtool
accepts and which fire, and stay quiet, on synthetic series as the plugin writes them.

Their schemas are checked with every kustomization in test_deploy_manifests.py (against
prometheus-operator's own, see monitoring_schemas.py); only a real Prometheus with the
operator shows that it selects these objects (its selectors are the cluster's choice).
"""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path
from typing import Any

import monitoring_schemas
import pytest
import yaml
from deploy_support import (
    COMPONENTS_DIR,
    METRICS_PORT,
    container,
    daemonset,
    one,
)

from tests.system_tools import PROMTOOL, needs_tool

RULES_FILE = COMPONENTS_DIR / "monitoring" / "prometheusrule.yaml"
JOB = "accelerator-device-plugin"
ALERTS = {"AcceleratorResourceNotRegistered", "AcceleratorDevicesUnhealthy",
          "AcceleratorDraSlicesOutOfSync", "AcceleratorDraClaimErrors",
          "AcceleratorDeviceLoadFailed", "AcceleratorFunctionLoadsFailing",
          "AcceleratorDevicePluginMetricsDown"}
RESOURCE = "b-com.com/accelerator"
DRIVER = "accelerator.b-com.com"


@pytest.fixture(scope="module")
def objects(rendered: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return rendered["aws-units+metrics+monitoring"]


@pytest.fixture(scope="module")
def promtool() -> str:
    return needs_tool("promtool", PROMTOOL)


def rule_file(rule: dict[str, Any], directory: Path, *, annotations: bool = True) -> Path:
    """The PrometheusRule's groups as a Prometheus rule file."""
    groups = copy.deepcopy(rule["spec"]["groups"])
    if not annotations:
        for group in groups:
            for r in group["rules"]:
                r.pop("annotations", None)
    path = directory / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return path


def run(*command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(command), capture_output=True, text=True, timeout=120,
                          check=False, cwd=cwd)


# --- Service and ServiceMonitor ------------------------------------------------------------


def test_service_selects_the_plugin_pods_on_the_metrics_port(objects):
    service = one(objects, "Service")
    ds = daemonset(objects)
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["clusterIP"] == "None", "headless: one endpoint per pod"
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (port,) = service["spec"]["ports"]
    ports = {p["name"]: p["containerPort"] for p in container(objects)["ports"]}
    assert port["targetPort"] in ports and ports[port["targetPort"]] == METRICS_PORT
    assert port["name"] == "metrics" and port["port"] == METRICS_PORT
    assert service["metadata"]["namespace"] == ds["metadata"]["namespace"]


def test_service_monitor_scrapes_that_service_under_a_stable_job_name(objects):
    service = one(objects, "Service")
    monitor = one(objects, "ServiceMonitor")
    spec = monitor["spec"]
    assert spec["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert "namespaceSelector" not in spec, "the Service is in the ServiceMonitor's namespace"
    assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"]
    (endpoint,) = spec["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    # The job is a label value a name prefix does not change, and the one the alerts read.
    assert service["metadata"]["labels"][spec["jobLabel"]] == JOB
    down = [r for r in one(objects, "PrometheusRule")["spec"]["groups"][0]["rules"]
            if r["alert"] == "AcceleratorDevicePluginMetricsDown"]
    assert f'up{{job="{JOB}"}}' in down[0]["expr"]
    # The node label every alert's description names.
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} in \
        endpoint["relabelings"]


def test_monitoring_schema_check_can_fail(objects):
    monitor = copy.deepcopy(one(objects, "ServiceMonitor"))
    monitor["spec"]["jobLable"] = monitor["spec"].pop("jobLabel")
    assert any("jobLable" in e for e in monitoring_schemas.validate(monitor))
    rule = copy.deepcopy(one(objects, "PrometheusRule"))
    rule["spec"]["groups"][0]["rules"][0]["for"] = "10 minutes"
    assert any("/for" in e for e in monitoring_schemas.validate(rule))
    assert monitoring_schemas.validate(one(objects, "PrometheusRule")) == []


# --- the rules -----------------------------------------------------------------------------


def test_rule_group_is_the_one_file_and_has_every_alert(objects):
    rule = one(objects, "PrometheusRule")
    (shipped,) = yaml.safe_load_all(RULES_FILE.read_text())
    assert rule["spec"] == shipped["spec"]
    (group,) = rule["spec"]["groups"]
    assert {r["alert"] for r in group["rules"]} == ALERTS
    for r in group["rules"]:
        assert r["labels"]["severity"] in {"warning", "critical"}
        assert {"summary", "description"} <= set(r["annotations"]), r["alert"]
        # Only the plugin's own series, and `up` of its own job.
        names = set(re.findall(r"\b([a-z_]+)\s*(?:\{|\[| offset|\)| ==| >|$)", r["expr"],
                               re.M))
        series = {n for n in names if n.startswith("accelerator_device_plugin_") or n == "up"}
        assert series, r["alert"]


def test_promtool_accepts_the_rules(promtool, objects, tmp_path):
    path = rule_file(one(objects, "PrometheusRule"), tmp_path)
    done = run(promtool, "check", "rules", str(path), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in done.stdout


def test_promtool_check_can_fail(promtool, objects, tmp_path):
    rule = copy.deepcopy(one(objects, "PrometheusRule"))
    rule["spec"]["groups"][0]["rules"][0]["expr"] = "sum by (job (up)"
    done = run(promtool, "check", "rules", str(rule_file(rule, tmp_path)), cwd=tmp_path)
    assert done.returncode != 0


def target(name: str) -> str:
    """The labels Prometheus gives every series of one plugin pod's target."""
    return (f'job="{JOB}",namespace="kube-system",pod="plugin-{name}",node="node-{name}",'
            f'instance="10.0.0.{ord(name[0]) - 96}:{METRICS_PORT}"')


def labels(name: str, **extra: str) -> dict[str, str]:
    found = dict(re.findall(r'(\w+)="([^"]*)"', target(name)))
    return {**found, **extra}


SERIES = [
    # a: a device-plugin node whose resource is not registered (registered at 0): fires.
    (f'accelerator_device_plugin_devices{{resource="{RESOURCE}",health="Healthy",'
     f'{target("a")}}}', "2x30"),
    (f'accelerator_device_plugin_devices{{resource="{RESOURCE}",health="Unhealthy",'
     f'{target("a")}}}', "0x30"),
    (f'accelerator_device_plugin_registered{{resource="{RESOURCE}",generation="v1beta1",'
     f'{target("a")}}}', "0x30"),
    (f'accelerator_device_plugin_node_api{{api="device-plugin",{target("a")}}}', "1x30"),
    (f'accelerator_device_plugin_node_api{{api="dra",{target("a")}}}', "0x30"),
    # b: registered: quiet.
    (f'accelerator_device_plugin_devices{{resource="{RESOURCE}",health="Healthy",'
     f'{target("b")}}}', "2x30"),
    (f'accelerator_device_plugin_registered{{resource="{RESOURCE}",generation="v1beta1",'
     f'{target("b")}}}', "1x30"),
    (f'accelerator_device_plugin_node_api{{api="device-plugin",{target("b")}}}', "1x30"),
    # c: no registered series at all yet (never got that far): fires.
    (f'accelerator_device_plugin_devices{{resource="{RESOURCE}",health="Healthy",'
     f'{target("c")}}}', "1x30"),
    (f'accelerator_device_plugin_node_api{{api="device-plugin",{target("c")}}}', "1x30"),
    # d: on DRA, so the device plugin is rightly not registered: quiet.
    (f'accelerator_device_plugin_devices{{resource="{RESOURCE}",health="Healthy",'
     f'{target("d")}}}', "1x30"),
    (f'accelerator_device_plugin_node_api{{api="device-plugin",{target("d")}}}', "0x30"),
    (f'accelerator_device_plugin_node_api{{api="dra",{target("d")}}}', "1x30"),
    (f'accelerator_device_plugin_dra_slices_in_sync{{driver="{DRIVER}",{target("d")}}}',
     "1x30"),
    # e: a resource whose devices are gone (withdrawn, so unregistered): quiet.
    (f'accelerator_device_plugin_devices{{resource="{RESOURCE}",health="Healthy",'
     f'{target("e")}}}', "0x30"),
    (f'accelerator_device_plugin_node_api{{api="device-plugin",{target("e")}}}', "1x30"),
    # f: registered, one device Unhealthy: the Unhealthy alert only.
    (f'accelerator_device_plugin_devices{{resource="{RESOURCE}",health="Healthy",'
     f'{target("f")}}}', "1x30"),
    (f'accelerator_device_plugin_devices{{resource="{RESOURCE}",health="Unhealthy",'
     f'{target("f")}}}', "1x30"),
    (f'accelerator_device_plugin_registered{{resource="{RESOURCE}",generation="v1beta1",'
     f'{target("f")}}}', "1x30"),
    (f'accelerator_device_plugin_node_api{{api="device-plugin",{target("f")}}}', "1x30"),
    # g: slices that cannot be written.
    (f'accelerator_device_plugin_dra_slices_in_sync{{driver="{DRIVER}",{target("g")}}}',
     "0x30"),
    # i: the first prepare error ever, at minute 5: the error series appears at 1.
    (f'accelerator_device_plugin_dra_claims_total{{driver="{DRIVER}",operation="prepare",'
     f'result="error",{target("i")}}}', "_x4 1x25"),
    (f'accelerator_device_plugin_dra_claims_total{{driver="{DRIVER}",operation="prepare",'
     f'result="ok",{target("i")}}}', "0+3x30"),
    # j: unprepare errors all along.
    (f'accelerator_device_plugin_dra_claims_total{{driver="{DRIVER}",operation="unprepare",'
     f'result="error",{target("j")}}}', "0+1x30"),
    # n: a failed load leaves a device in an unknown state at minute 3, and it stays so.
    (f'accelerator_device_plugin_devices_load_failed{{{target("n")}}}', "0x2 1x40"),
    # o: one cleared (a load succeeded) at minute 4, before the 5 minutes: quiet.
    (f'accelerator_device_plugin_devices_load_failed{{{target("o")}}}', "1x3 0x40"),
    # p: one failed load long ago, then three more at minutes 40, 45 and 50; loads that
    # succeed all along, which are no failures.
    (f'accelerator_device_plugin_dra_programming_total{{driver="{DRIVER}",family="intel",'
     f'loader="ioctl",result="failed",{target("p")}}}', "1x39 2x4 3x4 4x40"),
    (f'accelerator_device_plugin_dra_programming_total{{driver="{DRIVER}",family="intel",'
     f'loader="ioctl",result="loaded",{target("p")}}}', "0+2x90"),
    # q: the first failed load ever at minute 10 (the series appears at 1), then two more
    # at 12 and 14: three within 30 minutes, of which increase() sees two.
    (f'accelerator_device_plugin_dra_programming_total{{driver="{DRIVER}",family="alveo",'
     f'loader="xbutil",result="failed",{target("q")}}}', "_x10 1x1 2x1 3x80"),
    # r: two failed loads only, the series new: quiet.
    (f'accelerator_device_plugin_dra_programming_total{{driver="{DRIVER}",family="aws",'
     f'loader="fpga-load-local-image",result="failed",{target("r")}}}', "_x10 1x4 2x80"),
    # l: a target that cannot be scraped; m: one that can.
    (f'up{{{target("l")}}}', "0x30"),
    (f'up{{{target("m")}}}', "1x30"),
]


def alerts(*nodes: tuple[str, dict[str, str]], severity: str = "warning"
           ) -> list[dict[str, Any]]:
    return [{"exp_labels": {**labels(node, **extra), "severity": severity}}
            for node, extra in nodes]


CASES = [
    # (minute, alert, expected firing alerts)
    (9, "AcceleratorResourceNotRegistered", []),  # pending: for 10m
    (11, "AcceleratorResourceNotRegistered",
     alerts(("a", {"resource": RESOURCE}), ("c", {"resource": RESOURCE}),
            severity="critical")),
    (4, "AcceleratorDevicesUnhealthy", []),
    (6, "AcceleratorDevicesUnhealthy", alerts(("f", {"resource": RESOURCE}))),
    (4, "AcceleratorDraSlicesOutOfSync", []),
    (6, "AcceleratorDraSlicesOutOfSync", alerts(("g", {"driver": DRIVER}))),
    (3, "AcceleratorDraClaimErrors",
     alerts(("j", {"driver": DRIVER, "operation": "unprepare"}))),
    # The first error ever: increase() cannot see it, the new-series half does.
    (7, "AcceleratorDraClaimErrors",
     alerts(("i", {"driver": DRIVER, "operation": "prepare"}),
            ("j", {"driver": DRIVER, "operation": "unprepare"}))),
    # Ten minutes and more after that one error: quiet again.
    (20, "AcceleratorDraClaimErrors",
     alerts(("j", {"driver": DRIVER, "operation": "unprepare"}))),
    (7, "AcceleratorDeviceLoadFailed", []),  # pending: for 5m
    (9, "AcceleratorDeviceLoadFailed", alerts(("n", {}))),
    (13, "AcceleratorFunctionLoadsFailing", []),  # two failures so far
    # The third failure of a new series: only the new-series half sees it.
    (15, "AcceleratorFunctionLoadsFailing",
     alerts(("q", {"driver": DRIVER, "family": "alveo", "loader": "xbutil"}))),
    # p's second and third failures in 30 minutes: quiet; its fourth: fires.
    (48, "AcceleratorFunctionLoadsFailing", []),
    (52, "AcceleratorFunctionLoadsFailing",
     alerts(("p", {"driver": DRIVER, "family": "intel", "loader": "ioctl"}))),
    # More than 30 minutes after the last failure: quiet again.
    (81, "AcceleratorFunctionLoadsFailing", []),
    (4, "AcceleratorDevicePluginMetricsDown", []),
    (6, "AcceleratorDevicePluginMetricsDown", alerts(("l", {}))),
]


def unit_tests(rules: Path, cases: list[tuple[int, str, list[dict[str, Any]]]]) -> Path:
    test = {
        "rule_files": [rules.name],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [{"series": s, "values": v} for s, v in SERIES],
            "alert_rule_test": [{"eval_time": f"{minute}m", "alertname": alert,
                                 "exp_alerts": expected}
                                for minute, alert, expected in cases],
        }],
    }
    path = rules.parent / "rules_test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    return path


def test_each_alert_fires_on_its_series_and_only_there(promtool, objects, tmp_path):
    """promtool's rule unit tests: each alert fires for the pods whose series call for it,
    after its `for`, and not for the others (registered, on DRA, no devices, scraped)."""
    assert {alert for _, alert, _ in CASES} == ALERTS
    rules = rule_file(one(objects, "PrometheusRule"), tmp_path, annotations=False)
    done = run(promtool, "test", "rules", unit_tests(rules, CASES).name, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(("alert", "minute", "missed"), [
    ("AcceleratorDraClaimErrors", 7, 'operation="prepare"'),
    ("AcceleratorFunctionLoadsFailing", 15, 'family="alveo"'),
])
def test_unit_tests_can_fail(promtool, objects, tmp_path, alert, minute, missed):
    """Without the new-series half, the first DRA error ever, or the first three failed
    loads of a node, go unseen."""
    rule = copy.deepcopy(one(objects, "PrometheusRule"))
    for r in rule["spec"]["groups"][0]["rules"]:
        if r["alert"] == alert:
            r["expr"] = r["expr"].split("\nor\n")[0]
    rules = rule_file(rule, tmp_path, annotations=False)
    only = [c for c in CASES if c[0] == minute and c[1] == alert]
    assert only
    done = run(promtool, "test", "rules", unit_tests(rules, only).name, cwd=tmp_path)
    assert done.returncode != 0
    assert alert in done.stdout + done.stderr
    assert missed in done.stdout + done.stderr, done.stdout + done.stderr
