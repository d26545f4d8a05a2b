"""The kind matrix: run for real where Docker and kind exist, skipped (saying why) elsewhere.

The script's own checks are also exercised against stub docker/kind/kubectl commands, to show
that it fails when a node advertises the wrong count, when the DaemonSet lands on unlabelled
nodes, or when the example pod prints no unit. Those stub runs test the script, not Kubernetes.
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
    step = workflow["jobs"]["kind"]["steps"][-1]
    assert step["env"]["API"] == "${{ matrix.api }}" and '--api "$API"' in step["run"]


# --- the script's checks, against stub tools -----------------------------------------------

STUB_DOCKER = """#!/usr/bin/env bash
echo "docker $*" >> "$CALLS"
"""
STUB_KIND = """#!/usr/bin/env bash
echo "kind $*" >> "$CALLS"
if [[ $1 == version ]]; then echo "kind ${FAKE_KIND_VERSION:-v0.29.0} go1.24 linux/amd64"; fi
"""
STUB_KUBECTL = """#!/usr/bin/env bash
echo "kubectl $*" >> "$CALLS"
case "$*" in
  *"get node "*"-worker "*) printf '%s' "$FAKE_ALLOCATABLE" ;;
  *"get node "*"-control-plane "*) printf '%s' "${FAKE_CONTROL_PLANE:-}" ;;
  *"get daemonset accelerator-device-plugin"*) printf '%s' "${FAKE_SCHEDULED:-1}" ;;
  *"get pod accelerator-example"*) printf 'Succeeded' ;;
  *"logs accelerator-example"*) printf '%s\\n' "$FAKE_LOG" ;;
esac
"""


def run_with_stubs(tmp_path: Path, *args: str, **fake: str
                   ) -> tuple[subprocess.CompletedProcess[str], str]:
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    for name, body in (("docker", STUB_DOCKER), ("kind", STUB_KIND), ("kubectl", STUB_KUBECTL)):
        (stubs / name).write_text(body)
        (stubs / name).chmod(0o755)
    calls = tmp_path / "calls"
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "CALLS": str(calls), "KIND_TIMEOUT": "2",
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


def test_script_refuses_an_unknown_api(tmp_path):
    done, calls = run_with_stubs(tmp_path, "--node-image", "kindest/node:v1.36.1", "--api", "cri")
    assert done.returncode == 2
    assert "--api must be device-plugin or dra, not cri" in done.stderr
    assert calls == ""


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
