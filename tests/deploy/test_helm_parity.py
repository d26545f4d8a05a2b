"""What the chart tells the plugin is what serve understands, and the same as what the kustomize
overlays tell it for the same choice; the pods are hardened as the overlays' are; the alerts
name only metrics the plugin exports."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
from typing import Any

import pytest
import yaml
from deploy_support import (
    REPO,
    container,
    daemonset,
    env,
    env_from,
)
from helm_render import (
    CHART,
    config_file,
    example_names,
    example_values,
    of_kind,
    one,
    render,
    validate_monitoring,
)

from plugin.cli import config, validation

FILE_VARIABLE = config._env("--config")
"""Where the chart points serve at its config.yaml; the tests fold the file's keys into
variables instead, so this path (which exists only in the pod) is left out."""
CHART_ONLY = {"metrics_port", "config", "origins"}
"""What the chart sets and the overlays do not: metrics on 8080 (the overlays have them in
the metrics component), the config file itself, and where each setting came from (a file
for the chart, variables for the overlays)."""
SAMPLE_NODE = "fpga-node-1"
PAIRS = {"default": "base", "intel": "intel", "aws-units": "aws", "alveo": "alveo",
         "dra-auto": "dra", "programming": "dra+programming", "sharing": "dra+sharing"}
"""Example values file -> the kustomization that makes the same choice."""


def flags_of(command: str) -> set[str]:
    parser = config.build_parser()
    (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    sub = subparsers.choices[command]
    return {a.option_strings[0][2:] for a in sub._actions
            if a.option_strings and a.option_strings[0].startswith("--")} - {"help"}


def serve_flags() -> set[str]:
    return flags_of("serve")


def flag_variables() -> set[str]:
    """Variables serve reads, and healthcheck's (its heartbeat limit, for `kubectl exec ...
    healthcheck` by hand), as the overlays set them."""
    flags = serve_flags() | flags_of("healthcheck")
    return {config._env(f"--{flag}") for flag in flags}


def pools(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return of_kind(objects, "DaemonSet")


def _container(ds: dict[str, Any]) -> dict[str, Any]:
    (only,) = ds["spec"]["template"]["spec"]["containers"]
    return only


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def chart_environment(objects: list[dict[str, Any]], ds: dict[str, Any]) -> dict[str, str]:
    """The variables serve would see, with config.yaml folded in under the variables (which
    take precedence over the file): what --config gives, in terms this parser reads."""
    c = _container(ds)
    values = {e["name"]: e["value"] for e in c["env"] if "valueFrom" not in e}
    for e in c["env"]:
        if "valueFrom" in e:
            values[e["name"]] = SAMPLE_NODE
    for key, value in config_file(objects, ds).items():
        values.setdefault(config._env(f"--{key}"), _text(value))
    values.pop(FILE_VARIABLE, None)
    return values


def parse_with(variables: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> config.Settings:
    for name in list(os.environ):
        if name.startswith(config.ENV_PREFIX) or name == "NODE_NAME":
            monkeypatch.delenv(name)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    return config.parse(["serve"])


def comparable(settings: config.Settings) -> dict[str, Any]:
    fields = dataclasses.asdict(settings)
    return {k: v for k, v in fields.items() if k not in CHART_ONLY}


def overlay_environment(objects: list[dict[str, Any]]) -> dict[str, str]:
    values = env(objects)
    values.update(dict.fromkeys(env_from(objects), SAMPLE_NODE))
    return values


# --- the config file and the variables are serve's ------------------------------------------


@pytest.mark.parametrize("name", example_names())
def test_config_keys_are_serve_flags(name):
    objects = render(example_values(name))
    known = serve_flags()
    for ds in pools(objects):
        keys = set(config_file(objects, ds))
        assert keys <= known, f"no serve flag {sorted(keys - known)}"


def test_replicas_given_to_the_chart_reach_serve(monkeypatch):
    """``config.replicas`` (commented in values.yaml) is written to config.yaml as given,
    and serve reads it as the flag; the schema takes what serve takes."""
    objects = render({"config": {"replicas": "b-com.com/accelerator=4, *=2"}})
    (ds,) = pools(objects)
    assert config_file(objects, ds)["replicas"] == "b-com.com/accelerator=4, *=2"
    settings = parse_with(chart_environment(objects, ds), monkeypatch)
    assert [str(entry) for entry in settings.replicas] == ["b-com.com/accelerator=4", "*=2"]


def test_the_flag_check_knows_what_serve_does_not():
    """The check can fail: names serve has no flag for are not among the known ones."""
    assert "metrics-port" in serve_flags() and "backend" in serve_flags()
    assert not {"resource_mode", "resourceMode", "probe_port"} & serve_flags()


@pytest.mark.parametrize("name", example_names())
def test_every_pool_is_understood_by_serve(name, monkeypatch):
    objects = render(example_values(name))
    for ds in pools(objects):
        c = _container(ds)
        names = {e["name"] for e in c["env"]} - {"NODE_NAME"}
        assert names <= flag_variables(), f"no flag reads {sorted(names - flag_variables())}"
        assert c["command"] == ["accelerator-device-plugin"] and c["args"] == ["serve"]
        file = config_file(objects, ds)
        settings = parse_with(chart_environment(objects, ds), monkeypatch)
        assert settings.backend == file["backend"]
        assert settings.api == file["api"]
        assert settings.cdi is file["cdi"]
        assert settings.resource_name == file["resource-name"]
        if settings.api != "device-plugin":
            assert settings.node_name == SAMPLE_NODE
            assert validation.socket_path_problem(settings) is None
        # Where the file points serve at directories, the pod mounts them.
        mounts = {m["mountPath"] for m in c["volumeMounts"]}
        assert str(settings.device_plugin_dir) in mounts
        if settings.cdi:
            assert str(settings.cdi_spec_dir) in mounts
        if settings.api != "device-plugin" or settings.registration != "kubelet-socket":
            assert str(settings.plugins_registry_dir) in mounts
        env_names = {e["name"] for e in c["env"]}
        assert "ACCELERATOR_DP_CONFIG" in env_names
        (config_mount,) = [m for m in c["volumeMounts"] if m["name"] == "config"]
        assert config_mount["readOnly"] is True
        assert dict((e["name"], e.get("value")) for e in c["env"])["ACCELERATOR_DP_CONFIG"] == (
            f"{config_mount['mountPath']}/config.yaml")


# --- the same choice, the same settings as kustomize ---------------------------------------


def _host_mounts(ds: dict[str, Any]) -> set[tuple[str, str, bool, str]]:
    """(host path, mount path, read-only, hostPath type) of every hostPath mount."""
    spec = ds["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    (c,) = spec["containers"]
    found = set()
    for mount in c["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "hostPath" in volume:
            found.add((volume["hostPath"]["path"], mount["mountPath"],
                       bool(mount.get("readOnly", False)), volume["hostPath"]["type"]))
    return found


CHART_EXAMPLE_ONLY = {"programming": {"require_image_digest": True}}
"""What a chart example sets beyond its overlay, on purpose: the programming example pins its
class's image and requires every image pinned (the kustomize examples' classes carry no
digest, so the component leaves it to the admin)."""


@pytest.mark.parametrize(("example", "overlay"), PAIRS.items())
def test_example_sets_what_its_overlay_sets(rendered, example, overlay, monkeypatch):
    objects = render(example_values(example))
    (ds,) = pools(objects)
    chart = comparable(parse_with(chart_environment(objects, ds), monkeypatch))
    kustomize = comparable(parse_with(overlay_environment(rendered[overlay]), monkeypatch))
    for name, value in CHART_EXAMPLE_ONLY.get(example, {}).items():
        assert chart[name] == value and kustomize[name] != value
        kustomize[name] = value
    assert chart == kustomize
    assert _host_mounts(ds) == _host_mounts(daemonset(rendered[overlay]))


def _overlay_changes(rendered: dict[str, Any], name: str) -> dict[str, str]:
    base = overlay_environment(rendered["base"])
    return {k: v for k, v in overlay_environment(rendered[name]).items() if base.get(k) != v}


def test_the_combined_example_sets_what_three_overlays_set_together(rendered, monkeypatch):
    """Intel + CDI + plugin watcher: each overlay's changes to the base, applied together."""
    combined = overlay_environment(rendered["base"])
    mounts = _host_mounts(daemonset(rendered["base"]))
    for name in ("intel", "cdi", "plugin-watcher"):
        combined.update(_overlay_changes(rendered, name))
        mounts |= _host_mounts(daemonset(rendered[name]))
    objects = render(example_values("intel-cdi-plugin-watcher"))
    (ds,) = pools(objects)
    chart = comparable(parse_with(chart_environment(objects, ds), monkeypatch))
    assert chart == comparable(parse_with(combined, monkeypatch))
    assert _host_mounts(ds) == mounts


def test_the_parity_check_sees_a_different_choice(rendered, monkeypatch):
    """The check can fail: the intel example is not the base."""
    objects = render(example_values("intel"))
    (ds,) = pools(objects)
    chart = comparable(parse_with(chart_environment(objects, ds), monkeypatch))
    base = comparable(parse_with(overlay_environment(rendered["base"]), monkeypatch))
    assert chart != base and chart["backend"] == "intel" and base["backend"] == "auto"


def _joined_literals(spec: Any) -> Any:
    """The overlay writes the policy's account as CEL string literals joined with `+` (so a
    kustomize replacement can set the namespace and name pieces); the chart writes it whole.
    Both mean the same string once the literals are joined."""
    if isinstance(spec, dict):
        return {key: _joined_literals(value) for key, value in spec.items()}
    if isinstance(spec, list):
        return [_joined_literals(value) for value in spec]
    return spec.replace('" + "', "") if isinstance(spec, str) else spec


def test_dra_objects_are_the_overlays(rendered):
    chart = render(example_values("dra-auto"))
    overlay = rendered["dra"]
    for kind in ("DeviceClass", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
        assert _joined_literals(one(chart, kind)["spec"]) == \
            _joined_literals(one(overlay, kind)["spec"]), kind
        assert one(chart, kind)["metadata"]["name"] == one(overlay, kind)["metadata"]["name"]
    chart_rules = one(chart, "ClusterRole")["rules"]
    overlay_rules = one(overlay, "ClusterRole")["rules"]
    # Both grant the Events the pods write (events auto is on with DRA), and nothing else.
    def canonical(rules: list[dict[str, Any]]) -> list[str]:
        return sorted(json.dumps(rule, sort_keys=True) for rule in rules)

    assert canonical(chart_rules) == canonical(overlay_rules)


# --- who talks to the API server ------------------------------------------------------------

EVENTS_RULE = {"apiGroups": ["events.k8s.io"], "resources": ["events"],
               "verbs": ["create", "patch"]}


def test_the_device_plugin_gets_no_token_and_no_rbac():
    objects = render({})
    assert not {"ServiceAccount", "ClusterRole", "ClusterRoleBinding"} & {
        o["kind"] for o in objects}
    spec = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is False and "serviceAccountName" not in spec
    assert "NODE_NAME" not in {e["name"] for e in _container(one(objects, "DaemonSet"))["env"]}


def test_events_on_for_the_device_plugin_gets_events_rbac_only():
    objects = render({"config": {"events": "on"}})
    assert one(objects, "ClusterRole")["rules"] == [
        EVENTS_RULE, {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]
    spec = one(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is True
    assert spec["serviceAccountName"] == one(objects, "ServiceAccount")["metadata"]["name"]
    assert env_from([one(objects, "DaemonSet")]) == {
        "NODE_NAME": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    assert not of_kind(objects, "DeviceClass")


def test_events_off_with_dra_drops_the_events_rule():
    objects = render({"config": {"api": "auto", "events": "off"}})
    assert EVENTS_RULE not in one(objects, "ClusterRole")["rules"]
    assert one(objects, "DeviceClass")


# --- hardening, as the overlays' --------------------------------------------------------


@pytest.mark.parametrize("name", example_names())
def test_pods_are_hardened_as_the_overlays_are(rendered, name):
    base = daemonset(rendered["base"])
    overlay_mounts = set().union(*(_host_mounts(daemonset(objects))
                                   for objects in rendered.values()))
    programming = example_values(name).get("programming", {}).get("enabled", False)
    # The driver container is hardened alike with programming on (the loader is privileged).
    hardened = container([daemonset(rendered["dra+programming" if programming else "base"])])
    for ds in pools(render(example_values(name))):
        spec = ds["spec"]["template"]["spec"]
        assert _container(ds)["securityContext"] == hardened["securityContext"]
        assert spec["securityContext"] == base["spec"]["template"]["spec"]["securityContext"]
        for field in ("hostNetwork", "hostPID", "hostIPC"):
            assert not spec.get(field, False), field
        # Every host path as some overlay mounts it, read-only where the overlay's is.
        assert _host_mounts(ds) <= overlay_mounts
        assert spec["priorityClassName"] == "system-node-critical"
        assert ds["spec"]["updateStrategy"] == base["spec"]["updateStrategy"]
        assert ds["spec"]["minReadySeconds"] == base["spec"]["minReadySeconds"]
        for toleration in spec.get("tolerations", []):
            assert toleration.get("effect") != "NoExecute"


# --- ports and probes -------------------------------------------------------------------


def test_probes_and_metrics_use_the_ports_the_plugin_is_given():
    objects = render({"probes": {"port": 9091, "liveness": {"periodSeconds": 60}},
                      "metrics": {"port": 9090}})
    ds = one(objects, "DaemonSet")
    c = _container(ds)
    variables = {e["name"]: e.get("value") for e in c["env"]}
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert variables["ACCELERATOR_DP_PROBE_PORT"] == "9091" and ports["probes"] == 9091
    assert variables["ACCELERATOR_DP_METRICS_PORT"] == "9090" and ports["metrics"] == 9090
    assert c["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "probes"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "probes"}
    assert c["livenessProbe"]["periodSeconds"] == 60
    assert "exec" not in c["livenessProbe"] and "exec" not in c["readinessProbe"]
    service = one(objects, "Service")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9090,
                                         "targetPort": "metrics", "protocol": "TCP"}]
    assert service["spec"]["selector"].items() <= ds["spec"]["template"]["metadata"][
        "labels"].items()


def test_metrics_off_means_no_port_no_variable_no_service():
    objects = render({"metrics": {"enabled": False}})
    c = _container(one(objects, "DaemonSet"))
    assert "ACCELERATOR_DP_METRICS_PORT" not in {e["name"] for e in c["env"]}
    assert [p["name"] for p in c["ports"]] == ["probes"]
    assert not of_kind(objects, "Service")


# --- alerts ------------------------------------------------------------------------------

ALERTS_FILE = CHART / "files" / "alerts.yaml"
KUSTOMIZE_RULE = REPO / "deploy" / "components" / "monitoring" / "prometheusrule.yaml"


def exported_metrics() -> set[str]:
    """Every series name plugin/process/metrics.py defines (counters with _total)."""
    source = (REPO / "plugin" / "process" / "metrics.py").read_text()
    names = set()
    for kind, name in re.findall(r'prom\.(Gauge|Counter)\(\s*"(\w+)"', source):
        full = f"accelerator_device_plugin_{name}"
        names.add(f"{full}_total" if kind == "Counter" else full)
    return names


def test_alert_rules_are_the_file_and_name_only_exported_metrics():
    objects = render(example_values("monitoring"))
    rule = one(objects, "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(ALERTS_FILE.read_text())
    assert validate_monitoring(rule) == []
    exported = exported_metrics()
    assert "accelerator_device_plugin_dra_claims_total" in exported
    rules = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert set(rules) == {"AcceleratorResourceNotRegistered", "AcceleratorDevicesUnhealthy",
                          "AcceleratorDraSlicesOutOfSync", "AcceleratorDraClaimErrors",
                          "AcceleratorDeviceLoadFailed", "AcceleratorFunctionLoadsFailing",
                          "AcceleratorDevicePluginMetricsDown"}
    for alert in rules.values():
        used = set(re.findall(r"\b(accelerator_device_plugin_\w+)", alert["expr"]))
        assert used <= exported, f"{alert['alert']}: no such metric {sorted(used - exported)}"
    assert rules["AcceleratorResourceNotRegistered"]["for"] == "10m"
    assert 'api="device-plugin"' in rules["AcceleratorResourceNotRegistered"]["expr"]
    assert 'health="Unhealthy"' in rules["AcceleratorDevicesUnhealthy"]["expr"]
    assert 'result="error"' in rules["AcceleratorDraClaimErrors"]["expr"]
    assert 'result="failed"' in rules["AcceleratorFunctionLoadsFailing"]["expr"]
    assert rules["AcceleratorDeviceLoadFailed"]["for"] == "5m"
    # The ServiceMonitor gives every target the job the "down" alert names.
    monitor = one(objects, "ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert {"action": "replace", "targetLabel": "job",
            "replacement": "accelerator-device-plugin"} in endpoint["relabelings"]
    assert 'job="accelerator-device-plugin"' in rules["AcceleratorDevicePluginMetricsDown"]["expr"]
    service = one(objects, "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"][
        "labels"].items()


def test_the_metric_check_knows_a_misspelt_name():
    assert "accelerator_device_plugin_device" not in exported_metrics()
    assert "accelerator_device_plugin_dra_claims" not in exported_metrics()


def test_chart_and_kustomize_alerts_are_the_same():
    (kustomize,) = [d for d in yaml.safe_load_all(KUSTOMIZE_RULE.read_text()) if d]
    assert kustomize["spec"] == yaml.safe_load(ALERTS_FILE.read_text())


def test_the_claim_status_rule_names_the_configured_driver_only():
    """Kubernetes 1.36's granular authorization of status.devices writes is per driver
    name: the chart's rule follows config.dra-driver-name."""
    objects = render({"config": {"api": "auto", "dra-driver-name": "fpga.example.com"}})
    rules = one(objects, "ClusterRole")["rules"]
    assert {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/driver"],
            "verbs": ["associated-node:patch"], "resourceNames": ["fpga.example.com"]} in rules
    assert {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/status"],
            "verbs": ["patch"]} in rules
