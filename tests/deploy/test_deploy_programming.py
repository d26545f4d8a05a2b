"""FPGA programming as deployed: the programming component and the chart's ``programming``
values give the pod the same settings, the image library and tool directories read-only,
and a second container, the loader, the only privileged one, with no token, reached over a
socket directory only the two containers share; the driver stays hardened; only over DRA;
the example DeviceClasses are valid objects of every release with resource.k8s.io/v1 and
carry the function as the driver's opaque configuration.

What the classes select among published devices is checked with a real CEL evaluator in
compat_tests/test_allocate.py; what a real node allows a privileged pod to do with its FME
node, xbutil and an F1 slot only a real cluster shows (docs/deploying.md).
"""

from __future__ import annotations

import copy
import os
import re
from pathlib import PurePosixPath
from typing import Any

import pytest
import yaml
from deploy_support import (
    IMAGE_LIBRARY,
    PROGRAMMING_FLAGS,
    REPO,
    TOKEN_DIR,
    container,
    daemonset,
    env,
    every_container,
    load_yaml_file,
    loader,
    minor,
    pod_spec,
    render,
    token_mounts,
)
from helm_render import HelmRefused, config_file, example_values, of_kind, one
from helm_render import render as helm_render
from k8s_schemas import validate, validate_or_fall_back

from compat_tests.apiserver import models, pipeline
from plugin.cli import config

EXAMPLES = REPO / "deploy" / "examples" / "programming"
DRIVER = config.DEFAULT_DRA_DRIVER
FIRST_WITH_RESOURCE_V1 = "1.34"
DEFAULTS = {
    "programming": "on",
    "image-library": IMAGE_LIBRARY,
    "image-max-bytes": 536870912,
    "require-image-digest": False,
    "intel-loader": "ioctl",
    "fpgaconf": "/usr/bin/fpgaconf",
    "xbutil": "/opt/xilinx/xrt/bin/xbutil",
    "fpga-load-local-image": "/usr/bin/fpga-load-local-image",
    "fpga-describe-local-image": "/usr/bin/fpga-describe-local-image",
    "program-timeout": 120,
    "stop-timeout": 130,
}
"""serve's programming settings with programming on and every other flag at its default (the
stop timeout follows the program timeout: test_deploy_grace.py)."""
FUNCTION_IDS = {"afuID", "xclbinUUID", "agfiID"}
HEX32 = re.compile(r"^[0-9a-f]{32}$")
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
AGFI = re.compile(r"^agfi-[0-9a-f]{17}$")
ENABLED = {"config": {"api": "auto"}, "programming": {"enabled": True}}
LOADER_SOCKET = "/run/accelerator-loader/loader.sock"


@pytest.fixture(scope="module")
def examples(kubectl: str) -> list[dict[str, Any]]:
    return render(kubectl, EXAMPLES)


@pytest.fixture(scope="module")
def programmed(rendered: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return rendered["dra+programming"]


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


# --- the example DeviceClasses -------------------------------------------------------------


def test_the_kustomization_lists_every_example_file(examples):
    files = sorted(p for p in EXAMPLES.glob("*.yaml") if p.name != "kustomization.yaml")
    assert len(files) == 3
    from_files = [obj for path in files for obj in load_yaml_file(path)]
    assert sorted(o["metadata"]["name"] for o in examples) == sorted(
        o["metadata"]["name"] for o in from_files)


def _function(device_class: dict[str, Any]) -> dict[str, Any]:
    (entry,) = device_class["spec"]["config"]
    assert set(entry) == {"opaque"}, "the class's config applies to every request of it"
    opaque = entry["opaque"]
    assert opaque["driver"] == DRIVER
    parameters: dict[str, Any] = opaque["parameters"]
    return parameters


def test_each_example_carries_one_function_for_this_driver(examples):
    families = set()
    for device_class in examples:
        assert device_class["apiVersion"] == "resource.k8s.io/v1"
        assert device_class["kind"] == "DeviceClass"
        parameters = _function(device_class)
        assert parameters["apiVersion"] == f"{DRIVER}/v1alpha1"
        assert parameters["kind"] == "FpgaFunction"
        (identity,) = FUNCTION_IDS & set(parameters)
        if identity == "agfiID":
            assert AGFI.match(parameters["agfiID"]) and "image" not in parameters
            families.add("aws")
        else:
            pattern = HEX32 if identity == "afuID" else UUID
            assert pattern.match(parameters[identity]), parameters
            assert parameters["image"] and "/" not in parameters["image"]
            families.add("intel" if identity == "afuID" else "alveo")
        assert set(parameters) <= {"apiVersion", "kind", "image", "clearOnUnprepare",
                                   *FUNCTION_IDS}
    assert families == {"intel", "alveo", "aws"}


def test_each_example_selects_this_driver_first_then_a_family(examples):
    """The scheduler stops at the first selector that does not match, and an attribute
    lookup on a device without it is an error that aborts the allocation: the driver and
    family come first, so no other device reaches the lookups."""
    for device_class in examples:
        expressions = [s["cel"]["expression"] for s in device_class["spec"]["selectors"]]
        assert expressions[0] == f'device.driver == "{DRIVER}"'
        assert re.fullmatch(rf'device\.attributes\["{re.escape(DRIVER)}"\]\.family == '
                            r'"(intel|alveo|aws)"', expressions[1]), expressions[1]


def test_the_nlb0_class_maps_its_extended_resource(examples):
    (nlb0,) = [c for c in examples if "afuID" in _function(c)]
    assert nlb0["spec"]["extendedResourceName"] == "b-com.com/nlb0"


def test_examples_validate_from_the_release_with_resource_v1(examples, schema_sets):
    checked = []
    for schemas in schema_sets:
        if minor(schemas.version) < minor(FIRST_WITH_RESOURCE_V1):
            continue
        for device_class in examples:
            assert validate_or_fall_back(device_class, schemas) == [], (
                schemas.version, device_class["metadata"]["name"])
        checked.append(schemas.version)
    assert checked[0] == FIRST_WITH_RESOURCE_V1


@pytest.mark.parametrize("release", [m for m in models.MODELS
                                     if minor(m) >= minor(FIRST_WITH_RESOURCE_V1)])
def test_examples_are_accepted_by_the_emulated_api_server(examples, release):
    for device_class in examples:
        assert pipeline.validate(copy.deepcopy(device_class), model=release) == [], (
            release, device_class["metadata"]["name"])


def test_the_schemas_refuse_a_misspelt_config_field(examples, schema_sets):
    """The check can fail: ``opaque`` misspelt is refused by every release's schema."""
    broken = copy.deepcopy(examples[0])
    broken["spec"]["config"][0]["opaques"] = broken["spec"]["config"][0].pop("opaque")
    newest = max(schema_sets, key=lambda s: minor(s.version))
    assert any("opaques" in e for e in validate(broken, newest))
    assert pipeline.validate(broken, model="1.36") != []


def test_the_chart_example_renders_the_kustomize_nlb0_class():
    chart = [c for c in of_kind(helm_render(example_values("programming")), "DeviceClass")
             if c["metadata"]["name"] != DRIVER]
    (kustomize,) = [o for o in load_yaml_file(EXAMPLES / "intel-nlb0.yaml")]
    (rendered_class,) = chart
    assert rendered_class["metadata"]["name"] == kustomize["metadata"]["name"]
    # The chart's example pins the image (it requires digests); the rest is the same class.
    parameters = rendered_class["spec"]["config"][0]["opaque"]["parameters"]
    assert len(parameters.pop("sha256")) == 64
    assert rendered_class["spec"] == kustomize["spec"]


# --- the programming component -------------------------------------------------------------


def test_component_adds_the_settings_the_library_the_loader_and_nothing_else(programmed,
                                                                           rendered):
    dra = rendered["dra"]
    added = {k: v for k, v in env(programmed).items() if env(dra).get(k) != v}
    assert added.pop("ACCELERATOR_DP_LOADER_SOCKET") == LOADER_SOCKET
    assert added == {config._env(f"--{k}"): _text(v) for k, v in DEFAULTS.items()
                     if config._env(f"--{k}") in added}
    assert {"ACCELERATOR_DP_PROGRAMMING", "ACCELERATOR_DP_IMAGE_LIBRARY"} <= set(added)
    spec, before = pod_spec(programmed), pod_spec(dra)
    new_volumes = {v["name"]: v for v in spec["volumes"] if v not in before["volumes"]}
    assert sorted(new_volumes) == ["api-access", "image-library", "loader-socket"]
    assert new_volumes["image-library"] == {"name": "image-library", "hostPath": {
        "path": IMAGE_LIBRARY, "type": "DirectoryOrCreate"}}
    assert new_volumes["loader-socket"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "1Mi"}
    mounts = {m["name"]: m for m in container(programmed)["volumeMounts"]}
    assert mounts["image-library"] == {"name": "image-library", "mountPath": IMAGE_LIBRARY,
                                       "readOnly": True}
    assert mounts["loader-socket"]["readOnly"] is True
    assert mounts["api-access"] == {"name": "api-access", "mountPath": TOKEN_DIR,
                                    "readOnly": True}
    # Nothing else of the driver's pod changes: not its privilege, above all.
    stripped = copy.deepcopy(daemonset(programmed))
    template = stripped["spec"]["template"]["spec"]
    c = template["containers"][0]
    c["env"] = [e for e in c["env"] if e["name"] not in added and
                e["name"] != "ACCELERATOR_DP_LOADER_SOCKET"]
    c["volumeMounts"] = [m for m in c["volumeMounts"] if m["name"] not in new_volumes]
    template["volumes"] = before["volumes"]
    del template["initContainers"]
    template["automountServiceAccountToken"] = True
    del template["terminationGracePeriodSeconds"]  # test_deploy_grace.py
    assert stripped == daemonset(dra)


def _both(programmed: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """The pod spec the component gives and the one the chart's example gives."""
    chart = one(helm_render(example_values("programming")), "DaemonSet")
    return [("kustomize", pod_spec(programmed)), ("chart", chart["spec"]["template"]["spec"])]


def test_the_loader_is_the_only_privileged_container_and_has_no_token(programmed):
    for source, spec in _both(programmed):
        privileged = {c["name"] for c in every_container(spec)
                      if c.get("securityContext", {}).get("privileged")}
        assert privileged == {"loader"}, source
        assert token_mounts(spec) == {"accelerator-device-plugin"}, source
        (driver,) = spec["containers"]
        security = driver["securityContext"]
        assert security["privileged"] is False and security["allowPrivilegeEscalation"] is False
        assert security["capabilities"] == {"drop": ["ALL"]}
        assert security["readOnlyRootFilesystem"] is True
        (sidecar,) = spec["initContainers"]
        assert sidecar["restartPolicy"] == "Always", "a native sidecar, up before the driver"
        assert sidecar["args"] == ["loader"]
        assert sidecar["image"] == driver["image"]
        assert sidecar["securityContext"]["readOnlyRootFilesystem"] is True
        assert not any(field in spec for field in ("hostNetwork", "hostPID", "hostIPC"))


def test_only_the_two_containers_share_the_socket_directory(programmed):
    for source, spec in _both(programmed):
        (driver,) = spec["containers"]
        (sidecar,) = spec["initContainers"]
        found = {}
        for c in (driver, sidecar):
            (mount,) = [m for m in c["volumeMounts"] if m["name"] == "loader-socket"]
            variables = {e["name"]: e.get("value") for e in c["env"]}
            socket_dir = str(PurePosixPath(variables["ACCELERATOR_DP_LOADER_SOCKET"]).parent)
            assert mount["mountPath"] == socket_dir, source
            found[c["name"]] = mount.get("readOnly", False)
        assert found == {"accelerator-device-plugin": True, "loader": False}, source


def test_the_loader_shares_the_drivers_state_directory_at_the_drivers_path(programmed):
    """Each card's lock and load records are kept there: the loader, the driver and the
    next pod's loader (a rolling update) must see the same host directory, read-write."""
    for source, spec in _both(programmed):
        (driver,) = spec["containers"]
        (sidecar,) = spec["initContainers"]
        paths = {}
        for c in (driver, sidecar):
            variables = {e["name"]: e.get("value") for e in c["env"]}
            (mount,) = [m for m in c["volumeMounts"] if m["name"] == "dra-state"]
            assert mount["mountPath"] == variables["ACCELERATOR_DP_DRA_STATE_DIR"], source
            assert not mount.get("readOnly", False), source
            paths[c["name"]] = mount["mountPath"]
        assert paths["loader"] == paths["accelerator-device-plugin"], source
        (volume,) = [v for v in spec["volumes"] if v["name"] == "dra-state"]
        assert volume["hostPath"]["path"] == paths["loader"], source


def test_the_loader_discovers_and_reads_what_the_driver_does(rendered):
    for name in ("dra+programming", "dra+intel+programming+metrics"):
        objects = rendered[name]
        variables = {e["name"]: e.get("value") for e in loader(objects)["env"]}
        for key in ("ACCELERATOR_DP_BACKEND", "ACCELERATOR_DP_SYSFS_ROOT",
                    "ACCELERATOR_DP_DEV_ROOT", "ACCELERATOR_DP_IMAGE_LIBRARY",
                    "ACCELERATOR_DP_IMAGE_MAX_BYTES", "ACCELERATOR_DP_INTEL_LOADER",
                    "ACCELERATOR_DP_REQUIRE_IMAGE_DIGEST"):
            assert variables[key] == env(objects)[key], (name, key)
        driver_mounts = {m["mountPath"]: m for m in container(objects)["volumeMounts"]}
        for mount in loader(objects)["volumeMounts"]:
            if mount["mountPath"].startswith("/host/") or mount["name"] == "image-library":
                assert driver_mounts[mount["mountPath"]] == mount, (name, mount)
    assert {e["name"]: e.get("value") for e in loader(rendered["dra+intel+programming+metrics"])[
        "env"]}["ACCELERATOR_DP_BACKEND"] == "intel"


def _loader_settings(variables: dict[str, str], args: list[str]) -> config.Settings:
    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(variables)
        return config.parse(args)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_the_loader_containers_settings_parse(programmed, tmp_path):
    """What the loader is given (variables, and the chart's config.yaml) is read by the
    real parser without error, and says what the pod means."""
    variables = {e["name"]: e["value"] for e in loader(programmed)["env"]}
    settings = _loader_settings(variables, loader(programmed)["args"])
    assert settings.command == "loader" and settings.loader_allowed_uids == (0,)
    assert str(settings.loader_socket) == LOADER_SOCKET
    assert settings.loader_network == "isolate" and str(settings.image_library) == IMAGE_LIBRARY
    chart = helm_render(example_values("programming"))
    ds = one(chart, "DaemonSet")
    (sidecar,) = ds["spec"]["template"]["spec"]["initContainers"]
    file = tmp_path / "config.yaml"
    file.write_text(yaml.safe_dump(config_file(chart, ds)))
    variables = {e["name"]: e["value"] for e in sidecar["env"]}
    variables["ACCELERATOR_DP_CONFIG"] = str(file)
    settings = _loader_settings(variables, sidecar["args"])
    assert str(settings.loader_socket) == LOADER_SOCKET
    assert settings.intel_loader == "ioctl" and settings.backend == config_file(chart, ds).get(
        "backend", "auto")
    # The chart's example pins every image, and the loader enforces it on its own.
    assert settings.require_image_digest is True


def test_component_and_chart_give_serve_the_same_programming_settings(programmed):
    chart = helm_render(example_values("programming"))
    (ds,) = of_kind(chart, "DaemonSet")
    file = config_file(chart, ds)
    # The chart's example requires pinned images; the component leaves that to the admin.
    assert {k: file[k] for k in PROGRAMMING_FLAGS} == {**DEFAULTS, "require-image-digest": True}
    variables = env(programmed)
    for key, value in DEFAULTS.items():
        variable = config._env(f"--{key}")
        # The component leaves the tool paths at serve's defaults, which the chart writes.
        assert variables.get(variable, _text(value)) == _text(value), key
    chart_security = ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    assert chart_security == container(programmed)["securityContext"]


# --- the chart's programming values --------------------------------------------------------


def _programming_parts(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (ds,) = of_kind(objects, "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    file = config_file(objects, ds)
    return {"keys": set(file) & set(PROGRAMMING_FLAGS),
            "privileged": c["securityContext"].get("privileged"),
            "paths": {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v},
            "classes": [o["metadata"]["name"] for o in of_kind(objects, "DeviceClass")]}


def test_off_by_default_nothing_of_it_is_rendered():
    for values in ({}, {"config": {"api": "auto"}}):
        parts = _programming_parts(helm_render(values))
        assert parts["keys"] == set() and parts["privileged"] is False
        assert IMAGE_LIBRARY not in parts["paths"]


def test_values_flow_into_config_yaml_and_mounts():
    values = copy.deepcopy(ENABLED)
    values["programming"].update({
        "imageLibrary": {"hostPath": "/srv/fpga-images"}, "maxImageBytes": 1073741824,
        "intelLoader": "fpgaconf", "fpgaconf": "/opt/opae/bin/fpgaconf",
        "timeoutSeconds": 300, "toolsHostPaths": ["/opt/opae", "/opt/xilinx/xrt"]})
    objects = helm_render(values)
    (ds,) = of_kind(objects, "DaemonSet")
    file = config_file(objects, ds)
    assert {k: file[k] for k in PROGRAMMING_FLAGS} == {
        **DEFAULTS, "image-library": "/srv/fpga-images", "image-max-bytes": 1073741824,
        "intel-loader": "fpgaconf", "fpgaconf": "/opt/opae/bin/fpgaconf",
        "program-timeout": 300, "stop-timeout": 310}
    spec = ds["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    # The tools are the loader's: the driver runs none.
    host = {m["mountPath"]: (volumes[m["name"]]["hostPath"], m.get("readOnly", False))
            for m in spec["initContainers"][0]["volumeMounts"]
            if "hostPath" in volumes[m["name"]]}
    assert not {"/opt/opae", "/opt/xilinx/xrt"} & {
        m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    assert host["/srv/fpga-images"] == ({"path": "/srv/fpga-images",
                                         "type": "DirectoryOrCreate"}, True)
    for tools in ("/opt/opae", "/opt/xilinx/xrt"):
        assert host[tools] == ({"path": tools, "type": "Directory"}, True)
    assert IMAGE_LIBRARY not in host


@pytest.mark.parametrize(("values", "named"), [
    ({"programming": {"enabled": True}}, 'the DaemonSet has api "device-plugin"; set '
                                         "config.api to dra or auto"),
    ({"config": {"api": "auto"}, "programming": {"enabled": True},
      "nodePools": [{"name": "intel", "nodeSelector": {"vendor": "intel"}},
                    {"name": "old", "nodeSelector": {"vendor": "old"},
                     "config": {"api": "device-plugin"}}]},
     'node pool "old" has api "device-plugin"; set nodePools[1].config.api'),
])
def test_programming_without_dra_is_refused_naming_the_pool(values, named):
    with pytest.raises(HelmRefused) as refused:
        helm_render(values)
    assert "programming.enabled: FPGA programming is asked for through DRA" in str(refused.value)
    assert named in str(refused.value)


def test_the_same_values_without_programming_render():
    """The refusal is programming's: the same pools render with it off."""
    assert helm_render({"programming": {"enabled": False}})


def test_device_classes_render_with_this_drivers_name():
    values = copy.deepcopy(ENABLED)
    values["config"]["dra-driver-name"] = "fpga.example.com"
    values["programming"]["deviceClasses"] = [
        {"name": "hello.fpga.example.com",
         "selectors": ['device.attributes["fpga.example.com"].family == "aws"'],
         "function": {"agfiID": "agfi-0fcf87119b8e97bf3"}}]
    (_, hello) = of_kind(helm_render(values), "DeviceClass")
    assert hello["spec"]["selectors"][0] == {
        "cel": {"expression": 'device.driver == "fpga.example.com"'}}
    assert hello["spec"]["config"] == [{"opaque": {"driver": "fpga.example.com", "parameters": {
        "apiVersion": "fpga.example.com/v1alpha1", "kind": "FpgaFunction",
        "agfiID": "agfi-0fcf87119b8e97bf3"}}}]
    assert "extendedResourceName" not in hello["spec"]


def test_a_device_class_name_taken_twice_is_refused():
    values = copy.deepcopy(ENABLED)
    values["programming"]["deviceClasses"] = [
        {"name": DRIVER, "function": {"agfiID": "agfi-0fcf87119b8e97bf3"}}]
    with pytest.raises(HelmRefused, match=r"programming\.deviceClasses\[0\]\.name: "
                                          r'"accelerator\.b-com\.com" is already the name of '
                                          r"dra\.deviceClass"):
        helm_render(values)


def test_kubernetes_refuses_privileged_without_escalation(programmed):
    """Why the component sets allowPrivilegeEscalation true: the API server refuses
    privileged with it false (k/k ``ValidateSecurityContext``). The schemas do not say so,
    so the rule is written out here and checked on what both renderings give."""
    for security in (loader(programmed)["securityContext"],
                     one(helm_render(example_values("programming")), "DaemonSet")[
                         "spec"]["template"]["spec"]["initContainers"][0]["securityContext"]):
        assert security["privileged"] is True
        assert not (security.get("privileged") and
                    security.get("allowPrivilegeEscalation") is False)


def test_a_chart_class_may_pin_its_image_and_list_what_claims_choose():
    values = example_values("programming")
    function = values["programming"]["deviceClasses"][0]["function"]
    function["allowedClaimFunctions"] = [
        {"afuID": "9e1f4ab2c6d3487a8b0e5f1a2c3d4e5f", "image": "nlb3.gbs",
         "sha256": "ab" * 32}]
    objects = helm_render(values)
    (rendered,) = [c for c in of_kind(objects, "DeviceClass")
                   if c["metadata"]["name"] != DRIVER]
    parameters = rendered["spec"]["config"][0]["opaque"]["parameters"]
    assert parameters["allowedClaimFunctions"][0]["sha256"] == "ab" * 32
    (daemonset,) = of_kind(objects, "DaemonSet")
    assert config_file(objects, daemonset)["require-image-digest"] is True
    # What the driver reads, it accepts: the rendered configuration parses.
    from plugin.programming.function_config import parse_config

    parsed = parse_config(DRIVER, parameters, "DeviceClass configuration 0", from_class=True)
    assert parsed.spec is not None and len(parsed.allowed) == 1


@pytest.mark.parametrize("broken", [
    {"sha256": "not-a-digest"},
    {"allowedClaimFunctions": [{"image": "x.gbs"}]},
    {"clearOnUnprepare": {"afuID": "9e1f4ab2c6d3487a8b0e5f1a2c3d4e5f", "image": "b.gbs",
                          "sha256": "short"}},
])
def test_the_schema_refuses_a_malformed_pin_or_catalogue(broken):
    values = example_values("programming")
    values["programming"]["deviceClasses"][0]["function"].update(broken)
    with pytest.raises(HelmRefused):
        helm_render(values)
