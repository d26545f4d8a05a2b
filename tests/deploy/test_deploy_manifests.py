"""The manifests under deploy/: they render, they validate, and they are hardened."""

from __future__ import annotations

import argparse
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from deploy_support import (
    CDI_DIR,
    COMBINATIONS,
    DRA_STATE_DIR,
    IMAGE_LIBRARY,
    KUSTOMIZATIONS,
    METRICS_PORT,
    POD_RESOURCES_DIR,
    PROBE_PORT,
    REGISTRY_DIR,
    REPO,
    container,
    daemonset,
    env,
    env_from,
    load_yaml_file,
    minor,
    parts,
    pod_spec,
    quantity,
    token_mounts,
)
from k8s_schemas import SchemaSet, validate, validate_or_fall_back

from plugin.cli import config, validation

FPGA_LABEL = "accelerators.b-com.com/fpga"
PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
# hostPath sources the plugin may see, and whether it may write there.
ALLOWED_HOST_PATHS = {
    PLUGIN_DIR: True,
    REGISTRY_DIR: True,  # the watcher socket, and the DRA registration socket, live there
    CDI_DIR: True,  # the CDI specs the plugin writes
    # The DRA driver's own directory (its gRPC socket and claim checkpoint), and no other
    # of /var/lib/kubelet/plugins: other drivers' sockets and state are not its business.
    DRA_STATE_DIR: True,
    # The kubelet's PodResources socket: which devices running containers hold (DRA, auto).
    POD_RESOURCES_DIR: False,
    "/sys/class": False,
    "/sys/bus": False,
    "/sys/devices": False,
    "/dev": False,
    # The images FPGA programming loads (programming component), only read.
    IMAGE_LIBRARY: False,
}
CREATED_HOST_PATHS = {CDI_DIR, DRA_STATE_DIR, POD_RESOURCES_DIR, IMAGE_LIBRARY}
"""Host paths the plugin may create: a node's runtime reads CDI specs there but need not
have made the directory, and nobody but the DRA driver makes its own; the kubelet makes
pod-resources at start, but a node without it must still run the plugin; a node without
FPGA images must still serve its devices."""
DRA_KINDS = ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
             "ValidatingAdmissionPolicyBinding", "DaemonSet", "DeviceClass"]
"""What the dra overlay renders, in kustomize's order."""
KINDS_OF = {
    "serviceaccount": ["ServiceAccount"],
    "dra": ["ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding", "DeviceClass"],
    "events": ["ClusterRole", "ClusterRoleBinding"],
    "metrics": ["Service"],
    "monitoring": ["ServiceMonitor", "PrometheusRule"],
    "function-admission": ["ConfigMap", "ValidatingAdmissionPolicy",
                           "ValidatingAdmissionPolicyBinding", "ValidatingAdmissionPolicyBinding",
                           "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"],
}
"""What each component adds besides its DaemonSet patch. Only the serviceaccount component
(which dra brings) gives the pods an identity, and only dra, events and function-admission
(the driver reads Namespaces' grants and the catalogue) grant it anything: without them the
plugin never calls the API server."""


def oldest(name: str) -> str:
    return COMBINATIONS[name][1] if name in COMBINATIONS else KUSTOMIZATIONS[name][1]


ALL = sorted(KUSTOMIZATIONS) + sorted(COMBINATIONS)


# --- (a) every kustomization renders to the objects we expect ------------------------------


@pytest.mark.parametrize("name", ALL)
def test_kustomization_renders_one_daemonset_in_kube_system(rendered, name):
    objects = rendered[name]
    expected = ["DaemonSet"] + [k for c in sorted(parts(name)) for k in KINDS_OF.get(c, [])]
    assert sorted(o["kind"] for o in objects) == sorted(expected), (
        "no ServiceAccount, RBAC or anything else unless a component asks for it")
    if name == "dra":
        # DRA: the pods publish ResourceSlices and read claims (tests/deploy/test_deploy_dra.py).
        assert [o["kind"] for o in objects] == DRA_KINDS
    ds = daemonset(objects)
    assert ds["apiVersion"] == "apps/v1"
    assert ds["metadata"]["namespace"] == "kube-system"
    for obj in objects:
        # Namespaced objects beside the DaemonSet; cluster-scoped ones without a namespace.
        namespaced = obj["kind"] in ("ServiceAccount", "DaemonSet", "Service", "ServiceMonitor",
                                     "PrometheusRule", "ConfigMap", "Role", "RoleBinding")
        assert obj["metadata"].get("namespace") == ("kube-system" if namespaced else None), obj
    selector = ds["spec"]["selector"]["matchLabels"]
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= labels.items()


def test_single_file_is_the_rendered_base(rendered):
    single = load_yaml_file(REPO / "deploy" / "accelerator-device-plugin.yml")
    assert single == rendered["base"], (
        "deploy/accelerator-device-plugin.yml is stale: regenerate it with "
        "`kubectl kustomize deploy/base` (keeping its header comment)"
    )


# --- (b) schemas of several Kubernetes versions --------------------------------------------


def _check(objects: list[dict[str, Any]], sets: list[SchemaSet], oldest: str) -> dict[str, Any]:
    checked, problems = [], {}
    for schemas in sets:
        if minor(schemas.version) < minor(oldest):
            continue
        checked.append(schemas.version)
        for obj in objects:
            errors = validate_or_fall_back(obj, schemas)
            if errors:
                problems[f"{schemas.version} {obj['kind']}"] = errors[:5]
    return {"checked": checked, "problems": problems}


@pytest.mark.parametrize("name", ALL)
def test_rendered_objects_validate_from_their_oldest_to_the_newest_kubernetes(
    rendered, schema_sets, name
):
    first = oldest(name)
    result = _check(rendered[name], schema_sets, first)
    assert result["problems"] == {}
    newest = installed_versions_newest(schema_sets)
    assert result["checked"][0] == first and result["checked"][-1] == newest


def installed_versions_newest(sets: list[SchemaSet]) -> str:
    return max((s.version for s in sets), key=minor)


def test_single_file_and_example_pod_validate(schema_sets):
    single = _check(load_yaml_file(REPO / "deploy" / "accelerator-device-plugin.yml"),
                    schema_sets, "1.21")
    assert single["problems"] == {}
    pod = _check(load_yaml_file(REPO / "deploy" / "pod-example.yml"), schema_sets, "1.11")
    assert pod["problems"] == {}
    assert len(pod["checked"]) >= 20


def test_base_is_rejected_by_the_schemas_the_legacy_overlay_exists_for(rendered, schema_sets):
    """The check can fail: 1.20 has no maxSurge, 1.18 no seccompProfile field."""
    by_version = {s.version: s for s in schema_sets}
    ds = daemonset(rendered["base"])
    assert any("maxSurge" in e for e in validate(ds, by_version["1.20"]))
    assert any("seccompProfile" in e for e in validate(ds, by_version["1.18"]))
    assert validate(daemonset(rendered["legacy"]), by_version["1.11"]) == []


# --- (c) hardening, read off the rendered YAML ---------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_pod_has_no_host_namespaces_and_no_service_account_token(rendered, name):
    spec = pod_spec(rendered[name])
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        assert not spec.get(field, False), field
    if "serviceaccount" in parts(name):
        # Its own account, never "default", and a token the ResourceSlice policy can read
        # the node from.
        (account,) = [o for o in rendered[name] if o["kind"] == "ServiceAccount"]
        assert spec["serviceAccountName"] == account["metadata"]["name"] != "default"
        if "programming" in parts(name):
            # The token is the driver container's alone: a projected volume mounted into
            # it, the pod's automount off, so the privileged loader gets none.
            assert spec["automountServiceAccountToken"] is False
            assert token_mounts(spec) == {"accelerator-device-plugin"}
        else:
            assert spec["automountServiceAccountToken"] is True
    else:
        assert spec["automountServiceAccountToken"] is False
        assert "serviceAccountName" not in spec


@pytest.mark.parametrize("name", ALL)
def test_container_security_context(rendered, name):
    security = container(rendered[name])["securityContext"]
    # The driver is hardened with programming too: loading is the loader container's.
    assert security["allowPrivilegeEscalation"] is False
    assert security.get("privileged", False) is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["readOnlyRootFilesystem"] is True
    # Root on purpose (the kubelet's directory is root's), and said so explicitly.
    assert security["runAsUser"] == 0 and security["runAsNonRoot"] is False


@pytest.mark.parametrize("name", ALL)
def test_seccomp_runtime_default(rendered, name):
    ds = daemonset(rendered[name])
    spec = pod_spec(rendered[name])
    field = spec.get("securityContext", {}).get("seccompProfile")
    annotations = ds["spec"]["template"]["metadata"].get("annotations", {})
    annotation = annotations.get("seccomp.security.alpha.kubernetes.io/pod")
    if "legacy" in parts(name):
        assert field is None and annotation == "runtime/default"
    else:
        assert field == {"type": "RuntimeDefault"} and annotation is None
    assert "seccompProfile" not in container(rendered[name])["securityContext"]


@pytest.mark.parametrize("name", ALL)
def test_priority_update_strategy_and_node_selection(rendered, name):
    ds = daemonset(rendered[name])
    spec = pod_spec(rendered[name])
    assert spec["priorityClassName"] == "system-node-critical"
    strategy = ds["spec"]["updateStrategy"]
    assert strategy["type"] == "RollingUpdate"
    if "legacy" in parts(name):
        # Before 1.21 there is no surge: one pod at a time, the old one first.
        assert "maxSurge" not in strategy["rollingUpdate"]
        assert strategy["rollingUpdate"]["maxUnavailable"] == 1
    else:
        # The new pod waits for the old one's socket and takes over when it stops (see
        # compat_tests/test_reliability.py): no node is ever without its plugin.
        assert strategy["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert ds["spec"]["minReadySeconds"] > 0
    assert spec["nodeSelector"][FPGA_LABEL] == "true"
    for toleration in spec.get("tolerations", []):
        assert toleration.get("effect") != "NoExecute", "would keep the pod on dying nodes"


@pytest.mark.parametrize("name", ALL)
def test_mounts_are_read_only_except_the_device_plugin_directory(rendered, name):
    spec = pod_spec(rendered[name])
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = container(rendered[name])["volumeMounts"]
    if "programming" in parts(name):
        # The driver mounts the socket directory read-only and the token; the loader
        # mounts the socket directory writable and the node's trees (checked with it).
        assert {m["name"] for m in mounts} | {"loader-socket"} == set(volumes)
        assert volumes.pop("api-access")["projected"]
        mounts = [m for m in mounts if m["name"] != "api-access"]
    else:
        assert {m["name"] for m in mounts} == set(volumes), "every volume mounted, once"
    for mount in mounts:
        volume = volumes[mount["name"]]
        if "hostPath" in volume:
            source = volume["hostPath"]["path"]
            assert source in ALLOWED_HOST_PATHS, f"unexpected host path {source}"
            writable = ALLOWED_HOST_PATHS[source]
            assert mount.get("readOnly", False) is (not writable), mount
            # The kubelet's and kernel's directories must already be there; the CDI spec
            # directory belongs to no one until a writer makes it.
            expected = "DirectoryOrCreate" if source in CREATED_HOST_PATHS else "Directory"
            assert volume["hostPath"]["type"] == expected, source
            assert "mountPropagation" not in mount
        else:
            # Writable scratch only in memory and only for the heartbeat (and, read-only
            # here, the loader's socket directory).
            assert volume["emptyDir"] == {"medium": "Memory", "sizeLimit": "1Mi"}
            if mount["name"] == "loader-socket":
                assert mount["readOnly"] is True
    plugin_dir = [m for m in mounts if volumes[m["name"]].get("hostPath", {}).get("path")
                  == PLUGIN_DIR]
    assert [m["mountPath"] for m in plugin_dir] == [PLUGIN_DIR]


@pytest.mark.parametrize("name", ALL)
def test_environment_matches_the_mounts(rendered, name):
    values = env(rendered[name])
    mounts = {m["mountPath"] for m in container(rendered[name])["volumeMounts"]}
    assert values["ACCELERATOR_DP_DEVICE_PLUGIN_DIR"] in mounts
    heartbeat = PurePosixPath(values["ACCELERATOR_DP_HEARTBEAT_FILE"])
    assert str(heartbeat.parent) in mounts
    if values["ACCELERATOR_DP_BACKEND"] == "units":
        # Reads no hardware: nothing of /sys or /dev is mounted.
        assert not any(m.startswith("/host/") for m in mounts)
        assert "ACCELERATOR_DP_SYSFS_ROOT" not in values
    else:
        sysfs = values["ACCELERATOR_DP_SYSFS_ROOT"]
        assert {f"{sysfs}/class", f"{sysfs}/bus", f"{sysfs}/devices"} <= mounts
        assert values["ACCELERATOR_DP_DEV_ROOT"] in mounts


def _flag_variables() -> set[str]:
    names = set()
    parser = config.build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                names |= {config._env(a.option_strings[0]) for a in sub._actions
                          if a.option_strings and a.option_strings[0].startswith("--")}
    return names


SAMPLE_NODE = "fpga-node-1"
"""What the downward API would put in NODE_NAME."""


def parse_serve(args: list[str], monkeypatch: pytest.MonkeyPatch) -> config.Settings:
    return config.parse(args)


@pytest.mark.parametrize("name", ALL)
def test_environment_is_understood_by_serve_and_healthcheck(rendered, name, monkeypatch):
    values = env(rendered[name])
    unknown = set(values) - _flag_variables()
    assert not unknown, f"no flag reads {sorted(unknown)}"
    # Only NODE_NAME comes from elsewhere: --node-name's default, from the downward API.
    assert set(env_from(rendered[name])) <= {"NODE_NAME"}
    monkeypatch.delenv("NODE_NAME", raising=False)
    for key in env_from(rendered[name]):
        monkeypatch.setenv(key, SAMPLE_NODE)
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    c = container(rendered[name])
    assert c["command"] == ["accelerator-device-plugin"] and c["args"] == ["serve"]
    settings = parse_serve(c["args"], monkeypatch)
    assert settings.command == "serve"
    assert settings.api == values.get("ACCELERATOR_DP_API", "device-plugin")
    if settings.api != "device-plugin":
        assert settings.node_name == SAMPLE_NODE
        assert validation.socket_path_problem(settings) is None
    assert settings.backend == values["ACCELERATOR_DP_BACKEND"]
    assert settings.device_plugin_dir == Path(PLUGIN_DIR)
    assert settings.heartbeat_file == Path(values["ACCELERATOR_DP_HEARTBEAT_FILE"])
    # Same resource, socket and directory as the b<>com plugin.
    assert settings.resource_name == "b-com.com/accelerator"
    assert settings.socket_name == "accelerator.sock"
    # The exec probe of earlier manifests still works with the same environment.
    health = config.parse(["healthcheck"])
    assert health.command == "healthcheck"
    assert health.heartbeat_file == settings.heartbeat_file


@pytest.mark.parametrize("name", ALL)
def test_probes_are_http_gets_on_the_probe_port(rendered, name):
    """No probe starts a process: the kubelet GETs /livez and /readyz from serve itself,
    on the named port the variable opens."""
    c = container(rendered[name])
    ports = {p["name"]: p for p in c["ports"]}
    assert ports["probes"]["containerPort"] == PROBE_PORT
    assert ports["probes"].get("protocol", "TCP") == "TCP"
    assert int(env(rendered[name])["ACCELERATOR_DP_PROBE_PORT"]) == PROBE_PORT
    for probe, path in (("livenessProbe", "/livez"), ("readinessProbe", "/readyz")):
        assert set(c[probe]) - {"initialDelaySeconds", "periodSeconds", "timeoutSeconds",
                                "failureThreshold", "successThreshold"} == {"httpGet"}
        assert c[probe]["httpGet"] == {"path": path, "port": "probes"}, probe
    # Ports only where a component asks for them; never on the host.
    expected = {"probes"} | ({"metrics"} if "metrics" in parts(name) else set())
    assert set(ports) == expected
    for port in ports.values():
        assert "hostPort" not in port
    if "metrics" in parts(name):
        assert ports["metrics"]["containerPort"] == METRICS_PORT
        assert int(env(rendered[name])["ACCELERATOR_DP_METRICS_PORT"]) == METRICS_PORT
    else:
        assert "ACCELERATOR_DP_METRICS_PORT" not in env(rendered[name])


@pytest.mark.parametrize("name", ALL)
def test_liveness_outlasts_heartbeat_and_resources_are_bounded(rendered, name):
    c = container(rendered[name])
    values = env(rendered[name])
    max_age = float(values["ACCELERATOR_DP_HEARTBEAT_MAX_AGE"])
    interval = float(values.get("ACCELERATOR_DP_HEARTBEAT_INTERVAL",
                                config.Settings().heartbeat_interval))
    # A few missed self-checks in a row before the heartbeat counts as stale.
    assert max_age >= 3 * interval
    liveness = c["livenessProbe"]
    assert liveness["timeoutSeconds"] >= 5 and liveness["failureThreshold"] >= 2
    resources = c["resources"]
    for kind in ("cpu", "memory"):
        assert kind in resources["requests"] and kind in resources["limits"]
    assert quantity(resources["requests"]["memory"]) <= quantity(resources["limits"]["memory"])
    assert quantity(resources["requests"]["cpu"]) <= quantity(resources["limits"]["cpu"])


def test_overlays_pick_their_backend(rendered):
    assert env(rendered["base"])["ACCELERATOR_DP_BACKEND"] == "auto"
    assert env(rendered["intel"])["ACCELERATOR_DP_BACKEND"] == "intel"
    # One resource for every device unless the afu component says otherwise.
    for name in rendered:
        mode = env(rendered[name]).get("ACCELERATOR_DP_RESOURCE_MODE", "single")
        assert mode == ("afu" if "afu" in parts(name) else "single"), name
    alveo = env(rendered["alveo"])
    assert alveo["ACCELERATOR_DP_BACKEND"] == "alveo"
    assert alveo["ACCELERATOR_DP_RESOURCE_PREFIX"] == "amd.com"
    aws = env(rendered["aws"])
    assert aws["ACCELERATOR_DP_BACKEND"] == "units"
    assert aws["ACCELERATOR_DP_ACCEL_NBUNITS"] == "40"  # the b<>com default


def test_only_the_watcher_and_dra_components_mount_the_plugins_registry(rendered):
    # The watcher registers the device plugin there; DRA drivers register only there.
    for name, manifests in rendered.items():
        (daemonset,) = [m for m in manifests if m["kind"] == "DaemonSet"]
        spec = daemonset["spec"]["template"]["spec"]
        paths = [v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v]
        assert (REGISTRY_DIR in paths) == bool(parts(name) & {"plugin-watcher", "dra"}), name
        # The device plugin keeps kubelet.sock registration unless the watcher is asked for.
        registration = env(manifests).get("ACCELERATOR_DP_REGISTRATION")
        assert (registration == "auto") == ("plugin-watcher" in parts(name)), name


def test_only_the_cdi_and_dra_components_mount_the_cdi_directory_and_turn_cdi_on(rendered):
    # DRA hands containers their devices only as CDI IDs, so it cannot do without.
    for name, manifests in rendered.items():
        with_cdi = bool(parts(name) & {"cdi", "dra"})
        (daemonset,) = [m for m in manifests if m["kind"] == "DaemonSet"]
        spec = daemonset["spec"]["template"]["spec"]
        paths = [v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v]
        assert (CDI_DIR in paths) == with_cdi, name
        assert (env(manifests).get("ACCELERATOR_DP_CDI") == "true") == with_cdi, name
        if with_cdi:
            assert env(manifests)["ACCELERATOR_DP_CDI_SPEC_DIR"] == CDI_DIR
            (volume,) = [v for v in spec["volumes"]
                         if v.get("hostPath", {}).get("path") == CDI_DIR]
            # A node whose runtime never made the directory still starts the plugin.
            assert volume["hostPath"]["type"] == "DirectoryOrCreate"
            (container,) = spec["containers"]
            (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
            assert not mount.get("readOnly"), "the plugin writes specs there"


def test_example_pod_asks_for_one_unit_and_prints_it():
    (pod,) = load_yaml_file(REPO / "deploy" / "pod-example.yml")
    assert pod["kind"] == "Pod"
    (c,) = pod["spec"]["containers"]
    assert c["resources"]["limits"]["b-com.com/accelerator"] == 1
    assert "ACCELERATOR_UNITS=$ACCELERATOR_UNITS" in " ".join(c["command"])
    assert pod["spec"]["restartPolicy"] == "Never"
