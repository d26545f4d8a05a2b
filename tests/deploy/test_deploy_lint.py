"""Linters on the image and CI files: hadolint, actionlint (with shellcheck), shellcheck.

Each linter is first shown a file it must reject, so a linter that silently checks nothing
cannot make these tests pass.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from deploy_support import BIN, REPO, tool

WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))
SCRIPTS = [REPO / "compat_tests" / "kind" / "run.sh"]


def lint(*command: str) -> subprocess.CompletedProcess[str]:
    # actionlint runs shellcheck on every `run:` block when shellcheck is on PATH.
    env = {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}", "NO_COLOR": "1"}
    return subprocess.run(list(command), capture_output=True, text=True, timeout=120,
                          check=False, env=env, cwd=REPO)


def test_hadolint_rejects_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN cd /tmp && pip install grpcio\n")
    done = lint(tool("hadolint"), str(bad))
    assert done.returncode != 0
    assert "DL3006" in done.stdout  # untagged base image


def test_dockerfile_multistage_passes_hadolint():
    args = [tool("hadolint")]
    config = REPO / ".hadolint.yaml"
    if config.exists():
        args += ["--config", str(config)]
    done = lint(*args, str(REPO / "Dockerfile.multistage"))
    assert done.returncode == 0, done.stdout + done.stderr


def test_actionlint_rejects_a_bad_workflow(tmp_path):
    bad = tmp_path / ".github" / "workflows" / "bad.yml"
    bad.parent.mkdir(parents=True)
    bad.write_text(
        "on: push\njobs:\n  a:\n    runs-on: ubuntu-24.04\n    steps:\n"
        "      - run: echo ${{ matrix.nothing }}\n      - run: echo $UNQUOTED_VAR | xargs\n"
    )
    done = lint(tool("actionlint"), str(bad))
    assert done.returncode != 0
    assert "matrix" in done.stdout


def test_every_workflow_is_linted():
    assert {w.name for w in WORKFLOWS} >= {"kind-matrix.yml", "release.yml"}


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda w: w.name)
def test_workflow_passes_actionlint_with_shellcheck(workflow):
    assert Path(tool("shellcheck")).exists()
    done = lint(tool("actionlint"), str(workflow))
    assert done.returncode == 0, done.stdout + done.stderr


def test_actionlint_runs_shellcheck_on_run_blocks(tmp_path):
    # An unquoted variable in a `run:` block of the release workflow: only shellcheck sees it.
    bad = tmp_path / ".github" / "workflows" / "release.yml"
    bad.parent.mkdir(parents=True)
    text = (REPO / ".github" / "workflows" / "release.yml").read_text()
    assert 'helm push "$chart"' in text
    bad.write_text(text.replace('helm push "$chart"', "helm push $chart"))
    done = lint(tool("actionlint"), str(bad))
    assert done.returncode != 0 and "SC2086" in done.stdout, done.stdout


def test_shellcheck_rejects_a_bad_script(tmp_path):
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/usr/bin/env bash\nrm -rf $1/*\n")
    assert lint(tool("shellcheck"), str(bad)).returncode != 0


def test_kind_script_passes_shellcheck():
    for script in SCRIPTS:
        done = lint(tool("shellcheck"), str(script))
        assert done.returncode == 0, done.stdout
        assert os.access(script, os.X_OK), f"{script} is not executable"
