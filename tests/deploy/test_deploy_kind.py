"""The kind matrix: run for real where Docker and kind exist, skipped (saying why) elsewhere.

The script's own checks are also exercised against stub docker/kind/kubectl commands, to show
that it fails when a node advertises the wrong count, when the DaemonSet lands on unlabelled
nodes, or when the example pod prints no unit; and, for the DRA entry, when the worker's
ResourceSlices are missing, when it still advertises the resource, when the plugin chose the
device plugin, or when the example pod was not served through a DRA claim. Those stub runs
test the script, not Kubernetes: only a real run shows that a kubelet does what they fake.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from deploy_support import REPO, daemonset, render

RUN = REPO / "compat_tests" / "kind" / "run.sh"
MATRIX = REPO / "compat_tests" / "kind" / "matrix.txt"
WORKFLOW = REPO / ".github" / "workflows" / "kind-matrix.yml"
KIND_DRA = REPO / "compat_tests" / "kind" / "dra"
APIS = ("device-plugin", "dra")


def matrix_entries() -> list[dict[str, str]]:
    entries = []
    for line in MATRIX.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            kubernetes, kind, node_image, overlay, api = line.split()
            entries.append({"kubernetes": kubernetes, "kind": kind, "node_image": node_image,
                            "overlay": overlay, "api": api})
    return entries


def missing_prerequisites() -> list[str]:
    missing = []
    docker = shutil.which("docker")
    if docker is None:
        missing.append("the docker client")
    else:
        info = subprocess.run([docker, "info"], capture_output=True, text=True, timeout=60,
                              check=False)
        if info.returncode != 0:
            said = (info.stderr or info.stdout).strip().splitlines()
            missing.append(f"a running Docker engine (`docker info`: {' '.join(said[-1:])})")
    for binary in ("kind", "kubectl"):
        if shutil.which(binary) is None:
            missing.append(f"the {binary} binary")
    return missing


@pytest.mark.kind
@pytest.mark.timeout(7200)
def test_kind_matrix():
    missing = missing_prerequisites()
    if missing:
        pytest.skip("kind matrix not run here (needs Docker engine, kind and kubectl); "
                    "missing: " + "; ".join(missing))
    done = subprocess.run([str(RUN)], capture_output=True, text=True, timeout=7000, check=False)
    assert done.returncode == 0, done.stdout + done.stderr[-5000:]
    assert " 0 failed" in done.stdout


def test_script_refuses_to_run_without_its_tools(tmp_path):
    """Where something is missing, the script says what and exits 77; it never pretends."""
    if any(Path(d, "kind").exists() for d in ("/usr/bin", "/bin")):
        pytest.skip("kind is installed in /usr/bin or /bin: cannot hide it from the script")
    done = subprocess.run(["/bin/bash", str(RUN), "--check"], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin"}, timeout=60, check=False)
    assert done.returncode == 77
    assert "kind matrix not run; missing:" in done.stderr and "kind" in done.stderr


def test_workflow_matrix_is_the_matrix_file():
    workflow = yaml.safe_load(WORKFLOW.read_text())
    include = workflow["jobs"]["kind"]["strategy"]["matrix"]["include"]
    assert include == matrix_entries()
    minors = [int(e["kubernetes"].split(".")[1]) for e in matrix_entries()]
    assert minors == sorted(minors) and minors[0] <= 21 and minors[-1] >= 33
    for entry in matrix_entries():
        assert "@sha256:" in entry["node_image"], "kind node images must be pinned by digest"
        assert entry["node_image"].startswith(f"kindest/node:v{entry['kubernetes']}.")
        assert (REPO / entry["overlay"] / "kustomization.yaml").exists()
        # Clusters before 1.21 need the legacy overlay (no maxSurge, seccomp annotation).
        legacy = int(entry["kubernetes"].split(".")[1]) < 21
        assert entry["overlay"].endswith("legacy") is legacy
        # The API decides the checks; the dra overlay is the only one that can pass the DRA
        # ones, and only where extendedResourceName is on without a feature gate (1.36+:
        # cluster.yaml sets none).
        assert entry["api"] in APIS
        assert (entry["overlay"] == "compat_tests/kind/dra") is (entry["api"] == "dra")
        if entry["api"] == "dra":
            assert int(entry["kubernetes"].split(".")[1]) >= 36
    assert [e["api"] for e in matrix_entries()].count("dra") >= 1
    step = workflow["jobs"]["kind"]["steps"][-1]
    assert step["env"]["API"] == "${{ matrix.api }}" and '--api "$API"' in step["run"]


# --- the script's checks, against stub tools -----------------------------------------------

STUB_DOCKER = """#!/usr/bin/env bash
echo "docker $*" >> "$CALLS"
# containerd's merged configuration, as a kind node of containerd 2.x prints it.
if [[ $1 == exec && $2 == *-worker && "${*:3}" == "containerd config dump" ]]; then
  printf '%s\\n' "${FAKE_CONTAINERD_CONFIG-$DEFAULT_CONTAINERD_CONFIG}"
fi
"""
STUB_KIND = """#!/usr/bin/env bash
echo "kind $*" >> "$CALLS"
if [[ $1 == version ]]; then echo "kind ${FAKE_KIND_VERSION:-v0.29.0} go1.24 linux/amd64"; fi
"""
# ResourceSlices answer only the query run.sh must make: this driver, one node, device names.
STUB_KUBECTL = """#!/usr/bin/env bash
echo "kubectl $*" >> "$CALLS"
slices() { for ((i = 0; i < $1; i++)); do printf 'unit-%d\\n' "$i"; done; }
driver=',spec.driver=accelerator.b-com.com'
devices='jsonpath={range .items[*]}{range .spec.devices[*]}{.name}{"\\n"}{end}{end}'
slices_of='get resourceslices --field-selector spec.nodeName='
pod='get pod accelerator-example -o jsonpath='
claim_status='.status.extendedResourceClaimStatus'
case "$*" in
  *"get node "*"-worker "*) printf '%s' "$FAKE_ALLOCATABLE" ;;
  *"get node "*"-control-plane "*) printf '%s' "${FAKE_CONTROL_PLANE:-}" ;;
  *"get daemonset accelerator-device-plugin"*) printf '%s' "${FAKE_SCHEDULED:-1}" ;;
  *"$slices_of"*"-worker$driver -o $devices") slices "${FAKE_SLICES_WORKER:-0}" ;;
  *"$slices_of"*"-control-plane$driver -o $devices") slices "${FAKE_SLICES_CONTROL_PLANE:-0}" ;;
  *"get deviceclass accelerator.b-com.com -o jsonpath={.spec.extendedResourceName}")
    printf '%s' "${FAKE_EXTENDED_RESOURCE_NAME-b-com.com/accelerator}" ;;
  *"logs daemonset/accelerator-device-plugin"*) printf '%s\\n' "${FAKE_PLUGIN_LOG:-}" ;;
  *"$pod{$claim_status.resourceClaimName}") printf '%s' "${FAKE_CLAIM:-}" ;;
  *"$pod{range $claim_status.requestMappings[*]}"*) printf '%s\\n' "${FAKE_MAPPINGS:-}" ;;
  *"$pod{.status.phase}") printf 'Succeeded' ;;
  *"logs accelerator-example"*) printf '%s\\n' "$FAKE_LOG" ;;
esac
"""
CONTAINERD_CDI = """[plugins]
  [plugins.'io.containerd.cri.v1.runtime']
    cdi_spec_dirs = ['/etc/cdi', '/var/run/cdi']
    enable_cdi = true"""
DRA_WORKER = "accel-v1-36-1-dra-worker"
CHOSE_DRA = (f"2026-06-03 10:00:01,000 INFO    plugin.process.dra_side: node {DRA_WORKER}: "
             "serving its devices through DRA: the kubelet registered the DRA driver and a "
             "DeviceClass maps b-com.com/accelerator")
CHOSE_DEVICE_PLUGIN = (
    f"2026-06-03 10:00:01,000 INFO    plugin.process.dra_side: node {DRA_WORKER}: serving its "
    "devices through the device plugin: no DeviceClass maps b-com.com/accelerator "
    "(spec.extendedResourceName), so pods asking for it by name would find nothing through DRA "
    "(resource.k8s.io/v1 is served)")
DRA = {  # a kind v0.32.0 binary (so the matrix runs its 1.36 DRA entry) and a DRA node
    "FAKE_KIND_VERSION": "v0.32.0", "FAKE_ALLOCATABLE": "", "FAKE_SLICES_WORKER": "40",
    "FAKE_PLUGIN_LOG": CHOSE_DRA, "FAKE_CLAIM": "accelerator-example-extended-resources-x7k2p",
    "FAKE_MAPPINGS": "show-units/b-com.com/accelerator",
}


def run_with_stubs(tmp_path: Path, *args: str, **fake: str
                   ) -> tuple[subprocess.CompletedProcess[str], str]:
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    for name, body in (("docker", STUB_DOCKER), ("kind", STUB_KIND), ("kubectl", STUB_KUBECTL)):
        (stubs / name).write_text(body)
        (stubs / name).chmod(0o755)
    calls = tmp_path / "calls"
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "CALLS": str(calls), "KIND_TIMEOUT": "2",
           "DEFAULT_CONTAINERD_CONFIG": CONTAINERD_CDI,
           "FAKE_ALLOCATABLE": "40", "FAKE_LOG": "ACCELERATOR_UNITS=7", **fake}
    done = subprocess.run(["/bin/bash", str(RUN), *args], capture_output=True, text=True,
                          env=env, timeout=120, check=False, cwd=tmp_path)
    return done, calls.read_text() if calls.exists() else ""


def test_script_passes_when_every_check_holds(tmp_path):
    done, calls = run_with_stubs(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "kind: 1 passed, 0 failed"
    assert f"docker build -f {REPO}/Dockerfile.multistage" in calls
    assert "kind load docker-image k8s-accelerator-devplugin:kind --name accel-v1-33-1" in calls
    assert "label node accel-v1-33-1-worker accelerators.b-com.com/fpga=true" in calls
    assert f"apply -k {REPO}/compat_tests/kind\n" in calls
    assert f"apply -f {REPO}/deploy/pod-example.yml" in calls
    assert "kind delete cluster --name accel-v1-33-1" in calls.splitlines()[-1]
    # Entries built for other kind releases are skipped, and said to be.
    assert "skip 1.21: its node image is built for kind v0.16.0" in done.stderr
    assert "skip 1.36: its node image is built for kind v0.32.0" in done.stderr
    # A device-plugin entry: none of the DRA steps.
    for dra_only in ("resourceslices", "deviceclass", "dra/cluster", "containerd config dump",
                     "extendedResourceClaimStatus"):
        assert dra_only not in calls


@pytest.mark.parametrize(("fake", "complaint"), [
    ({"FAKE_ALLOCATABLE": "0"}, "allocatable b-com.com/accelerator is '0'"),
    ({"FAKE_SCHEDULED": "2"}, "only the labelled worker should run one"),
    ({"FAKE_CONTROL_PLANE": "40"}, "unlabelled control plane advertises 40"),
    ({"FAKE_LOG": "ACCELERATOR_UNITS="}, "printed 'ACCELERATOR_UNITS='"),
    ({"FAKE_LOG": "ACCELERATOR_UNITS=40"}, "expected ACCELERATOR_UNITS=<0..39>"),
])
def test_script_fails_when_a_check_does_not_hold(tmp_path, fake, complaint):
    done, _ = run_with_stubs(tmp_path, **fake)
    assert done.returncode == 1
    assert complaint in done.stderr
    assert done.stdout.strip().splitlines()[-1] == "kind: 0 passed, 1 failed"


# --- the DRA entry --------------------------------------------------------------------------


def test_dra_entry_passes_when_every_check_holds(tmp_path):
    done, calls = run_with_stubs(tmp_path, **DRA)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "kind: 1 passed, 0 failed"
    assert "skip 1.33: its node image is built for kind v0.29.0" in done.stderr
    assert ("PASS v1.36.1 (dra): ResourceSlices list 40 devices of accel-v1-36-1-dra-worker, "
            "which advertises no b-com.com/accelerator; example pod got ACCELERATOR_UNITS=7 "
            "through claim accelerator-example-extended-resources-x7k2p") in done.stderr
    lines = calls.splitlines()

    def first(call: str) -> int:
        return next(i for i, line in enumerate(lines) if call in line)

    assert "--image kindest/node:v1.36.1@sha256:3489c7674813ba5d8b1a9977baea8a6e553784dab7b8" \
           "4759d1014dbd78f7ebd5" in calls
    # In the order docs/deploying.md gives: CDI on the node, the cluster-wide objects and
    # their DeviceClass checked, then the DaemonSet, the node's API, slices, the pod.
    order = [
        "label node accel-v1-36-1-dra-worker accelerators.b-com.com/fpga=true",
        "docker exec accel-v1-36-1-dra-worker containerd config dump",
        f"apply -k {REPO}/deploy/overlays/dra/cluster",
        "get deviceclass accelerator.b-com.com",
        f"apply -k {REPO}/compat_tests/kind/dra",
        "rollout status daemonset/accelerator-device-plugin",
        "logs daemonset/accelerator-device-plugin",
        "spec.nodeName=accel-v1-36-1-dra-worker,spec.driver=accelerator.b-com.com",
        "get node accel-v1-36-1-dra-worker ",
        "spec.nodeName=accel-v1-36-1-dra-control-plane,spec.driver=accelerator.b-com.com",
        f"apply -f {REPO}/deploy/pod-example.yml",
        "logs accelerator-example",
        "extendedResourceClaimStatus.resourceClaimName",
    ]
    assert [first(call) for call in order] == sorted(first(call) for call in order)
    assert "kind delete cluster --name accel-v1-36-1-dra" in lines[-1]


def test_dra_entry_runs_alone_with_its_api(tmp_path):
    done, calls = run_with_stubs(
        tmp_path, "--node-image", matrix_entries()[-1]["node_image"],
        "--overlay", "compat_tests/kind/dra", "--api", "dra", **DRA)
    assert done.returncode == 0, done.stderr
    assert "skip" not in done.stderr
    assert f"apply -k {REPO}/compat_tests/kind/dra" in calls


def test_script_refuses_an_unknown_api(tmp_path):
    done, calls = run_with_stubs(tmp_path, "--node-image", "kindest/node:v1.36.1", "--api", "cri")
    assert done.returncode == 2
    assert "--api must be device-plugin or dra, not cri" in done.stderr
    assert calls == ""


@pytest.mark.parametrize(("fake", "complaint"), [
    # No slices, or not all of them: the node is not (fully) offered through DRA.
    ({"FAKE_SLICES_WORKER": "0"},
     "ResourceSlices of driver accelerator.b-com.com for accel-v1-36-1-dra-worker list 0 "
     "devices, expected 40"),
    ({"FAKE_SLICES_WORKER": "39"}, "list 39 devices, expected 40"),
    # The worker still advertises the name: the scheduler would never take the DRA path.
    ({"FAKE_ALLOCATABLE": "40"},
     "accel-v1-36-1-dra-worker still advertises 40 b-com.com/accelerator while serving "
     "through DRA"),
    # The example pod printed nothing, or no unit.
    ({"FAKE_LOG": ""}, "the example pod printed '', expected ACCELERATOR_UNITS=<0..39>"),
    ({"FAKE_LOG": "ACCELERATOR_UNITS="}, "printed 'ACCELERATOR_UNITS='"),
    # The plugin chose the device plugin, said nothing, or went back to the device plugin.
    ({"FAKE_PLUGIN_LOG": CHOSE_DEVICE_PLUGIN},
     "serves accel-v1-36-1-dra-worker through 'the device plugin: no DeviceClass maps"),
    ({"FAKE_PLUGIN_LOG": ""}, "through 'no API it logged', expected DRA"),
    ({"FAKE_PLUGIN_LOG": CHOSE_DRA + "\n" + CHOSE_DEVICE_PLUGIN}, "through 'the device plugin"),
    # The pod got a unit, but not through the scheduler's DRA claim.
    ({"FAKE_CLAIM": ""}, "the example pod has no status.extendedResourceClaimStatus"),
    ({"FAKE_MAPPINGS": "other/b-com.com/accelerator"},
     "mappings 'other/b-com.com/accelerator'): it was not served through DRA"),
    # The control plane publishes devices (node selection).
    ({"FAKE_SLICES_CONTROL_PLANE": "40"},
     "unlabelled control plane has 40 devices in ResourceSlices of accelerator.b-com.com"),
    # What the cluster must allow before the plugin is deployed.
    ({"FAKE_EXTENDED_RESOURCE_NAME": ""}, "dropped extendedResourceName"),
    ({"FAKE_CONTAINERD_CONFIG": CONTAINERD_CDI.replace("= true", "= false")},
     "containerd on accel-v1-36-1-dra-worker does not have CDI enabled"),
])
def test_dra_entry_fails_when_a_check_does_not_hold(tmp_path, fake, complaint):
    done, _ = run_with_stubs(tmp_path, **{**DRA, **fake})
    assert done.returncode == 1
    assert complaint in done.stderr
    assert "PASS" not in done.stderr
    assert done.stdout.strip().splitlines()[-1] == "kind: 0 passed, 1 failed"


# --- the DRA entry's overlay ----------------------------------------------------------------


def test_kind_dra_overlay_is_the_dra_overlay_with_the_kind_units_settings(kubectl):
    """compat_tests/kind/dra: the dra overlay (its cluster-wide objects unchanged) with the
    image and units backend that compat_tests/kind gives the base, and nothing else."""
    kind_dra = render(kubectl, KIND_DRA)
    dra = render(kubectl, REPO / "deploy" / "overlays" / "dra")
    kind = render(kubectl, REPO / "compat_tests" / "kind")
    base = render(kubectl, REPO / "deploy" / "base")
    assert [o for o in kind_dra if o["kind"] != "DaemonSet"] == \
        [o for o in dra if o["kind"] != "DaemonSet"]

    def parts(objects: list[dict]) -> tuple[dict, dict, list, list, str]:
        """The DaemonSet without env, mounts, volumes and image; and those four."""
        ds = yaml.safe_load(yaml.safe_dump(daemonset(objects)))
        spec = ds["spec"]["template"]["spec"]
        (c,) = spec["containers"]
        env = {e["name"]: e for e in c.pop("env")}
        return ds, env, c.pop("volumeMounts"), spec.pop("volumes"), c.pop("image")

    ours, ours_env, ours_mounts, ours_volumes, ours_image = parts(kind_dra)
    dra_rest, dra_env, dra_mounts, dra_volumes, _ = parts(dra)
    _, base_env, base_mounts, base_volumes, _ = parts(base)
    _, kind_env, kind_mounts, kind_volumes, kind_image = parts(kind)
    assert ours == dra_rest
    assert ours_image == kind_image == "k8s-accelerator-devplugin:kind"
    # What compat_tests/kind changes in the base, applied to the dra overlay.
    dropped = set(base_env) - set(kind_env)
    changed = {name: e for name, e in kind_env.items() if base_env.get(name) != e}
    assert ours_env == {**{n: e for n, e in dra_env.items() if n not in dropped}, **changed}
    assert ours_mounts == [m for m in dra_mounts if m in kind_mounts or m not in base_mounts]
    assert ours_volumes == [v for v in dra_volumes if v in kind_volumes or v not in base_volumes]
    values = {name: e.get("value") for name, e in ours_env.items()}
    assert values["ACCELERATOR_DP_BACKEND"] == "units"
    assert values["ACCELERATOR_DP_ACCEL_NBUNITS"] == "40"
    assert values["ACCELERATOR_DP_API"] == "auto"
    assert not [m for m in ours_mounts if m["mountPath"].startswith("/host/")]


def test_script_is_executable():
    assert os.access(RUN, os.X_OK)
