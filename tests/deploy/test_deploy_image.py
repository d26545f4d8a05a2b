"""Dockerfile.multistage, proven without a container engine.

The session fixture replays both stages (see dockerfile_replay): stage 1 builds the wheel from
the filtered build context and installs it into the runtime venv; stage 2 keeps nothing but
what its COPY --from lines take. The tests then run that venv the way the image would.

Replaying stage 1 is the slow step (two venvs, two pip installs from the package index), so
it is done once from scratch, with a VERSION the package does not report: that build must get
as far as its last check and be refused there. The image is then the build with the right
VERSION replayed over what the refused one left, as a builder reuses its layers.
"""

from __future__ import annotations

import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from deploy_support import REPO, quantity
from dockerfile_replay import (
    Stage,
    StageRun,
    base_image_python,
    context_files,
    ignore_rules,
    instructions,
    keep_only,
    replay_stage,
    stages,
)

from build_support.release import package_version

DOCKERFILE = REPO / "Dockerfile.multistage"
OCI_LABELS = {"title", "description", "version", "revision", "licenses"}
WRONG_VERSION = "9.9.9"

# The first test of this module to ask for the image replays it: about 45 s on two shared
# cores, and four times that and more while other work loads them (pytest's default 120 s
# was seen running out). Every step under it has its own bound (180 s for a venv, 600 s for a
# RUN line): this one is there for a hang in between.
pytestmark = pytest.mark.timeout(480)


@dataclass
class Image:
    root: Path
    venv: Path
    env: dict[str, str]
    wheel: Path
    context: list[str]
    base_stand_in: Path
    seconds: float
    refused: str | None
    """What replaying the build stage with VERSION=9.9.9 failed with (None: it did not)."""


def _stage(all_stages: list[Stage], name: str) -> Stage:
    (found,) = [s for s in all_stages if s.name == name]
    return found


@pytest.fixture(scope="session")
def image(tmp_path_factory) -> Image:
    started = time.monotonic()
    global_args, all_stages = stages(DOCKERFILE.read_text())
    files = sorted(context_files(REPO, ignore_rules((REPO / ".dockerignore").read_text())))
    scratch = tmp_path_factory.mktemp("image")
    root = scratch / "rootfs"
    base_python = Path(getattr(sys, "_base_executable", sys.executable)).resolve()
    # Each stage starts from the base image, whose python has pip and setuptools: a fresh
    # venv stands in for that interpreter, so RUN lines never touch a Python of this machine.
    build_python = base_image_python(base_python, scratch / "build-stage-python")
    build_stage = _stage(all_stages, "build")
    refused = _refusal(build_stage, {**global_args, "VERSION": WRONG_VERSION}, root,
                       build_python, files)
    build: StageRun = replay_stage(build_stage, global_args, root, build_python,
                                   context=REPO, files=files)
    (wheel,) = Path(build.variables["WHEELS"]).glob("k8s_accelerator_devplugin-*.whl")
    kept_wheel = scratch / wheel.name
    kept_wheel.write_bytes(wheel.read_bytes())
    stand_in = base_image_python(base_python, scratch / "runtime-stage-python")
    runtime = replay_stage(_stage(all_stages, "runtime"), global_args, root, stand_in,
                           previous={"build": build})
    keep_only(root, [target for _, _, target in runtime.copied_from])
    env = {k: v for k, v in runtime.variables.items() if k.isupper()}
    return Image(root, Path(runtime.variables["RUNTIME_VENV"]), env, kept_wheel, files,
                 stand_in, time.monotonic() - started, refused)


def _refusal(stage: Stage, global_args: dict[str, str], root: Path, python: Path,
             files: list[str]) -> str | None:
    try:
        replay_stage(stage, global_args, root, python, context=REPO, files=files)
    except AssertionError as failed:
        return str(failed)
    return None


def run_in_image(image: Image, *args: str, extra: dict[str, str] | None = None,
                 timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """A command with nothing but the image's environment, away from this checkout."""
    env = {**image.env, **(extra or {})}
    return subprocess.run(list(args), env=env, cwd=image.root, capture_output=True, text=True,
                          timeout=timeout, check=False)


# --- the Dockerfile itself -----------------------------------------------------------------


def test_two_stages_on_one_slim_python_image():
    global_args, all_stages = stages(DOCKERFILE.read_text())
    assert [s.name for s in all_stages] == ["build", "runtime"]
    bases = {s.base for s in all_stages}
    assert len(bases) == 1, "the copied venv needs the same interpreter in both stages"
    (base,) = bases
    assert base.startswith("python:3.11-slim"), base
    assert global_args["PYTHON_IMAGE"] == base


def test_build_stage_installs_grpcio_tools_and_builds_the_wheel():
    build = _stage(stages(DOCKERFILE.read_text())[1], "build")
    runs = " ".join(i.arguments for i in build.instructions if i.keyword == "RUN")
    assert "grpcio-tools" in runs
    assert "pip\" wheel" in runs or "pip wheel" in runs


def test_runtime_stage_adds_only_the_venv_and_metadata():
    runtime = _stage(stages(DOCKERFILE.read_text())[1], "runtime")
    keywords = [i.keyword for i in runtime.instructions]
    copies = [i.arguments for i in runtime.instructions if i.keyword == "COPY"]
    assert copies == ["--from=build ${RUNTIME_VENV} ${RUNTIME_VENV}"]
    for item in runtime.instructions:
        if item.keyword == "RUN":
            words = shlex.split(item.arguments)
            assert "install" not in words and "apt-get" not in words, item.arguments
    labels = " ".join(i.arguments for i in runtime.instructions if i.keyword == "LABEL")
    for label in OCI_LABELS:
        assert f"org.opencontainers.image.{label}=" in labels
    assert 'org.opencontainers.image.version="${VERSION}"' in labels
    (health,) = [i.arguments for i in runtime.instructions if i.keyword == "HEALTHCHECK"]
    assert 'CMD ["accelerator-device-plugin", "healthcheck"]' in health
    assert keywords[-2:] == ["ENTRYPOINT", "CMD"]
    entrypoint, cmd = (i.arguments for i in runtime.instructions[-2:])
    assert (entrypoint, cmd) == ('["accelerator-device-plugin"]', '["serve"]')


def test_instruction_parser_joins_continuations_and_drops_comments():
    parsed = instructions("FROM a AS b\n# note\nRUN one \\\n  # inner\n  && two\nCMD [\"x\"]\n")
    assert [(i.keyword, i.arguments) for i in parsed] == [
        ("FROM", "a AS b"), ("RUN", "one  && two"), ("CMD", '["x"]')]


# --- the build context ----------------------------------------------------------------------


def test_build_context_holds_the_sources_and_nothing_else(image):
    files = set(image.context)
    for needed in ("pyproject.toml", "README.md", "LICENSE", "build_support/backend.py",
                   "protos/v1beta1/api.proto", "plugin/cli/main.py", "api_versions/wire.py"):
        assert needed in files
    tops = {f.split("/")[0] for f in files}
    # compat_tests/ (emulators, fake sysfs trees, the demo) is in no wheel: not sent either.
    assert tops <= {"pyproject.toml", "MANIFEST.in", "README.md", "LICENSE", "build_support",
                    "protos", "api_versions", "plugin", "value_types"}
    assert not any("__pycache__" in f or f.endswith(".pyc") for f in files)
    assert not any(f.startswith("api_versions/_generated/") for f in files)


# --- stage 1: the wheel -----------------------------------------------------------------


def test_wheel_carries_descriptors_generated_from_protos(image):
    with zipfile.ZipFile(image.wheel) as wheel:
        names = set(wheel.namelist())
        metadata = next(wheel.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
        entry_points = next(
            wheel.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
    for generation in ("v1alpha1", "v1alpha2", "v1beta1"):
        assert f"api_versions/_generated/{generation}.binpb" in names
    assert "plugin/cli/main.py" in names
    assert {n.split("/")[0] for n in names} == {
        "plugin", "api_versions", "value_types",
        next(n for n in names if ".dist-info/" in n).split("/")[0]}
    assert "accelerator-device-plugin = plugin.cli.main:main" in entry_points
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert not any("grpcio-tools" in r or "grpcio_tools" in r for r in requires)


def test_build_stage_refuses_a_version_the_package_does_not_report(image):
    # What the release workflow's VERSION build argument must agree with: the package.
    global_args, _ = stages(DOCKERFILE.read_text())
    assert global_args["VERSION"] == package_version(REPO)
    assert image.refused is not None, "the build stage took VERSION=9.9.9"
    said = f"VERSION={WRONG_VERSION}, but the package built is {package_version(REPO)}"
    assert said in image.refused
    assert "exit 1" in image.refused or "failed (1)" in image.refused, image.refused


# --- stage 2: only what it copies -----------------------------------------------------------


def test_runtime_root_holds_only_the_copied_venv(image):
    present = {p.relative_to(image.root).as_posix() for p in image.root.rglob("*")
               if p.is_file()}
    venv = image.venv.relative_to(image.root).as_posix()
    assert present and all(p.startswith(venv + "/") for p in present)
    assert not list(image.root.rglob("*.whl"))


def test_runtime_venv_has_no_build_or_packaging_tools(image):
    site = next(image.venv.glob("lib/python3*/site-packages"))
    installed = {p.name.lower() for p in site.iterdir()}
    for unwanted in ("grpc_tools", "pip", "setuptools", "wheel"):
        assert unwanted not in installed, unwanted
        assert not any(n.startswith(unwanted + "-") for n in installed), unwanted
    assert not (image.venv / "bin" / "pip").exists()
    probe = run_in_image(image, str(image.venv / "bin" / "python"), "-c", "import grpc_tools")
    assert probe.returncode != 0 and "No module named 'grpc_tools'" in probe.stderr
    # Bytecode was compiled at install time: the read-only root filesystem needs none later.
    assert list((site / "plugin").glob("__pycache__/*.pyc"))


def test_runtime_venv_holds_no_emulator_fake_tree_or_demo(image):
    site = next(image.venv.glob("lib/python3*/site-packages"))
    ours = [p for top in ("plugin", "api_versions", "value_types")
            for p in (site / top).rglob("*.py")]
    assert ours
    assert not {p.name for p in ours if p.name.startswith(("fake_", "demo"))}
    assert not (site / "compat_tests").exists()
    probe = run_in_image(image, str(image.venv / "bin" / "python"), "-c", "import compat_tests")
    assert "No module named 'compat_tests'" in probe.stderr


def test_runtime_stage_strips_packaging_tools_from_the_base_python(image):
    python = image.base_stand_in / "bin" / "python"
    for module in ("pip", "setuptools"):
        done = subprocess.run([str(python), "-c", f"import {module}"], capture_output=True,
                              text=True, timeout=60, check=False)
        assert f"No module named '{module}'" in done.stderr


def test_runtime_imports_come_from_the_venv_not_this_checkout(image):
    done = run_in_image(image, "python", "-c", "import plugin, api_versions.wire as w; "
                        "print(plugin.__file__); print(w.__file__)")
    assert done.returncode == 0, done.stderr
    for line in done.stdout.split():
        assert Path(line).is_relative_to(image.venv), line


def test_runtime_help_and_discover(image):
    helped = run_in_image(image, "accelerator-device-plugin", "--help")
    assert helped.returncode == 0, helped.stderr
    for command in ("serve", "discover", "healthcheck"):
        assert command in helped.stdout
    for command in ("serve", "discover", "healthcheck"):
        sub = run_in_image(image, "accelerator-device-plugin", command, "--help")
        assert sub.returncode == 0 and "usage:" in sub.stdout, sub.stderr
    found = run_in_image(image, "accelerator-device-plugin", "discover", "--backend", "units",
                         "--accel-nbunits", "3")
    assert found.returncode == 0, found.stderr
    table = found.stdout.split("\n\n")[0]  # the settings given follow a blank line
    rows = [line.split() for line in table.splitlines()[1:]]
    assert [r[0] for r in rows] == ["0", "1", "2"]
    assert all("Healthy" in r for r in rows)


def test_runtime_cli_has_no_demo_command(image):
    # The demo runs from a source checkout (`make demo`); the image's CLI names what it has.
    done = run_in_image(image, "accelerator-device-plugin", "demo", "--node", "intel")
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert "invalid choice: 'demo'" in line
    assert all(f"'{c}'" in line for c in ("serve", "discover", "loader", "healthcheck"))


def test_runtime_healthcheck_answers_without_a_heartbeat(image, tmp_path):
    done = run_in_image(image, "accelerator-device-plugin", "healthcheck",
                        extra={"ACCELERATOR_DP_HEARTBEAT_FILE": str(tmp_path / "none")})
    assert done.returncode == 1 and done.stdout.strip(), done.stderr


# --- the running image: liveness and memory ------------------------------------------------


def _status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {key} for {pid}")


def _probe_peak_kib(image: Image, heartbeat: Path, max_age: str = "60") -> tuple[int, int]:
    """Exit code and peak RSS of one `healthcheck`, as the kubelet's exec probe starts it."""
    script = ("import resource, subprocess, sys; "
              "code = subprocess.run(sys.argv[1:]).returncode; "
              "print(code, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    done = run_in_image(image, sys.executable, "-c", script, "accelerator-device-plugin",
                        "healthcheck", "--heartbeat-max-age", max_age,
                        extra={"ACCELERATOR_DP_HEARTBEAT_FILE": str(heartbeat)})
    code, peak = done.stdout.split()[-2:]
    return int(code), int(peak)


def _wait_for(path: Path, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.1)
    return False


def test_serve_heartbeat_drives_the_probe_and_fits_the_memory_limit(image, tmp_path):
    plugin_dir = tmp_path / "device-plugins"
    plugin_dir.mkdir()
    heartbeat = tmp_path / "run" / "heartbeat"
    env = {**image.env, "ACCELERATOR_DP_HEARTBEAT_FILE": str(heartbeat)}
    process = subprocess.Popen(
        ["accelerator-device-plugin", "serve", "--backend", "units", "--device-plugin-dir",
         str(plugin_dir), "--heartbeat-interval", "1"],
        env=env, cwd=image.root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert _wait_for(heartbeat, 30), "serve never wrote its heartbeat"
        time.sleep(2)
        assert process.poll() is None
        serve_kib = statistics.median(_status_kib(process.pid, "VmRSS") for _ in range(3))
        code, probe_kib = _probe_peak_kib(image, heartbeat)
        assert code == 0
        # A wedged plugin: stopped, it writes no heartbeat, and the probe fails.
        os.kill(process.pid, signal.SIGSTOP)
        time.sleep(3.5)
        assert _probe_peak_kib(image, heartbeat, max_age="3")[0] == 1
        os.kill(process.pid, signal.SIGCONT)
        time.sleep(2.5)
        assert _probe_peak_kib(image, heartbeat, max_age="3")[0] == 0
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
    assert process.returncode == 0, process.stderr.read() if process.stderr else ""
    daemonset = yaml.safe_load((REPO / "deploy" / "base" / "daemonset.yaml").read_text())
    (c,) = daemonset["spec"]["template"]["spec"]["containers"]
    request = quantity(c["resources"]["requests"]["memory"]) / 1024
    limit = quantity(c["resources"]["limits"]["memory"]) / 1024
    print(f"serve VmRSS {serve_kib / 1024:.1f} MiB, healthcheck peak {probe_kib / 1024:.1f} MiB")
    assert request >= serve_kib, "the request must cover the steady state of serve"
    # The manifests' probes are HTTP GETs answered by serve: no probe process counts. Half
    # as much again as serve, for DRA's larger working set and bursts; exec-probe users
    # raise the limit by two healthcheck peaks (docs/deploying.md).
    assert limit >= 1.5 * serve_kib
    assert limit <= 4 * serve_kib, "limit far above what was measured"
    assert 1.25 * (serve_kib + 2 * probe_kib) <= 160 * 1024, "the exec-probe advice is short"
