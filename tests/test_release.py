"""Release hygiene: one version everywhere, the licence, the changelog, the release check.

``pyproject.toml`` holds the version. Everything else that names it (the image's default
``VERSION`` build argument, the image tag in the manifests and the docs, the chart) is held
equal to it here, and ``build_support/release.py`` refuses a tag that disagrees with it.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from packaging.version import Version

from build_support import release

REPO = Path(__file__).resolve().parent.parent
VERSION = release.package_version(REPO)
CHANGELOG = (REPO / "CHANGELOG.md").read_text()
# SHA-256 of the Apache License 2.0 as the ASF publishes it (LICENSE-2.0.txt), byte for byte
# the file Debian ships as /usr/share/common-licenses/Apache-2.0.
APACHE_2_0_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"
IMAGE_TAG = re.compile(r"k8s-accelerator-devplugin:(?P<tag>v?\d+\.\d+\.\d+[\w.+-]*)")
CHART = REPO / "deploy" / "helm" / "accelerator-device-plugin" / "Chart.yaml"


def test_package_version_is_a_release_version():
    assert release.VERSION.match(VERSION), VERSION


def test_license_is_the_apache_2_0_text():
    text = (REPO / "LICENSE").read_bytes()
    assert hashlib.sha256(text).hexdigest() == APACHE_2_0_SHA256
    common = Path("/usr/share/common-licenses/Apache-2.0")
    if common.exists():
        assert text == common.read_bytes()


# --- one version ---------------------------------------------------------------------------


def test_dockerfile_default_version_is_the_package_version():
    text = (REPO / "Dockerfile.multistage").read_text()
    before_first_stage = text[:re.search(r"^FROM ", text, re.MULTILINE).start()]
    (default,) = re.findall(r"^ARG VERSION=(\S+)$", before_first_stage, re.MULTILINE)
    assert default == VERSION
    # The stages take it from there: no second default that could disagree.
    assert re.findall(r"^ARG VERSION\b.*$", text, re.MULTILINE) == [
        f"ARG VERSION={VERSION}", "ARG VERSION", "ARG VERSION"]
    assert 'org.opencontainers.image.version="${VERSION}"' in text


def _files_naming_the_image() -> dict[str, list[str]]:
    candidates = [REPO / "README.md", REPO / "Dockerfile.multistage",
                  *(REPO / "docs").rglob("*.md"),
                  *(p for p in (REPO / "deploy").rglob("*") if p.is_file())]
    found = {}
    for path in candidates:
        tags = [m["tag"] for m in IMAGE_TAG.finditer(path.read_text(errors="replace"))]
        if tags:
            found[path.relative_to(REPO).as_posix()] = tags
    return found


def test_image_tag_in_manifests_and_docs_is_the_package_version():
    found = _files_naming_the_image()
    assert "deploy/base/daemonset.yaml" in found  # the pattern still finds the manifests
    wrong = {path: tags for path, tags in found.items() if set(tags) != {VERSION}}
    assert not wrong, f"image tags other than {VERSION}: {wrong}"


def test_chart_version_and_app_version_are_the_package_version():
    chart = yaml.safe_load(CHART.read_text())
    assert (chart["version"], str(chart["appVersion"])) == (VERSION, VERSION)


# --- the changelog -------------------------------------------------------------------------


def test_changelog_declares_keep_a_changelog_and_semver():
    assert "[Keep a Changelog](https://keepachangelog.com/en/1.1.0/)" in CHANGELOG
    assert "[Semantic Versioning](https://semver.org/spec/v2.0.0.html)" in CHANGELOG
    assert "\n## Compatibility policy\n" in CHANGELOG


def test_changelog_sections_are_dated_releases_newest_first():
    sections = release.sections(CHANGELOG)
    names = [s.name for s in sections]
    assert names.count("Unreleased") <= 1 and names[1:].count("Unreleased") == 0
    released = [s for s in sections if s.name != "Unreleased"]
    assert released and released[-1].name == "0.1.0"
    for section in released:
        assert release.VERSION.match(section.name), section.name
        assert section.date, f"{section.name} has no date"
        assert section.body and "TODO" not in section.body, section.name
    versions = [Version(s.name) for s in released]
    assert versions == sorted(versions, reverse=True)
    assert [s.date for s in released] == sorted((s.date for s in released), reverse=True)
    for section in sections:
        headings = re.findall(r"^### (.+)$", section.body, re.MULTILINE)
        assert set(headings) <= {"Added", "Changed", "Deprecated", "Removed", "Fixed",
                                 "Security"}, (section.name, headings)


def test_the_package_version_is_released_or_being_prepared():
    names = {s.name for s in release.sections(CHANGELOG)}
    released = {n for n in names if n != "Unreleased"}
    # Either this version has its dated section, or it is the next one: newer than every
    # release so far, with its entries gathering under [Unreleased].
    assert VERSION in released or (
        "Unreleased" in names and all(Version(VERSION) > Version(n) for n in released))


# --- the release check ---------------------------------------------------------------------


def _tree(tmp_path: Path, version: str, changelog: str) -> Path:
    (tmp_path / "pyproject.toml").write_text(f'[project]\nname = "x"\nversion = "{version}"\n')
    (tmp_path / "CHANGELOG.md").write_text(changelog)
    return tmp_path


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "build_support" / "release.py"), *args],
                          capture_output=True, text=True, timeout=60, check=False)


RELEASED = """# Changelog

## Compatibility policy

Breaking: flags.

## [Unreleased]

## [1.4.0] - 2027-01-02

### Added

- `--thing`.

## [1.3.9] - 2026-12-01

### Fixed

- a bug.

[1.4.0]: https://example.com/compare/v1.3.9...v1.4.0
"""


def test_check_accepts_the_tag_of_the_package_version(tmp_path):
    root = _tree(tmp_path, "1.4.0", RELEASED)
    done = _run("check", "v1.4.0", "--root", str(root))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["version=1.4.0", "minor=1.4", "prerelease=false"]
    notes = _run("notes", "1.4.0", "--root", str(root))
    assert notes.stdout == "### Added\n\n- `--thing`.\n"


def test_check_marks_a_pre_release(tmp_path):
    root = _tree(tmp_path, "1.5.0rc1", RELEASED.replace("[Unreleased]", "[1.5.0rc1] - 2027-02-01"
                                                        "\n\n### Added\n\n- more."))
    done = _run("check", "v1.5.0rc1", "--root", str(root))
    assert done.returncode == 0, done.stderr
    assert "prerelease=true" in done.stdout and "minor=1.5" in done.stdout


@pytest.mark.parametrize(("version", "tag", "changelog", "said"), [
    ("1.4.0", "v1.4.1", RELEASED, "tag 'v1.4.1' does not name the package version '1.4.0'"),
    ("1.4.0", "1.4.0", RELEASED, "tag '1.4.0' does not name the package version '1.4.0'"),
    ("1.5.0", "v1.5.0", RELEASED, "has no section for 1.5.0"),
    ("1.4.0", "v1.4.0", RELEASED.replace("[1.4.0] - 2027-01-02", "[1.4.0]"),
     "the section for 1.4.0 has no release date"),
    ("1.4.0", "v1.4.0", RELEASED.replace("- `--thing`.", "- TODO: the rest"),
     "still has TODO entries"),
    ("1.4.0", "v1.4.0", RELEASED.replace("### Added\n\n- `--thing`.\n", ""),
     "the section for 1.4.0 is empty"),
    ("1.4", "v1.4", RELEASED, "version '1.4' is not X.Y.Z"),
])
def test_check_refuses_what_must_not_be_released(tmp_path, version, tag, changelog, said):
    done = _run("check", tag, "--root", str(_tree(tmp_path, version, changelog)))
    assert done.returncode == 1
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert said in line, line


def test_this_tree_releases_only_its_own_version():
    done = _run("check", "v0.0.1")
    assert done.returncode == 1 and f"package version '{VERSION}'" in done.stderr


# --- the release workflow ------------------------------------------------------------------


def test_release_workflow_checks_tests_then_pushes_multi_arch_and_the_chart():
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "release.yml").read_text())
    assert workflow[True]["push"] == {"tags": ["v*"]}  # YAML 1.1 reads `on` as true
    jobs = workflow["jobs"]
    check_step = " ".join(s.get("run", "") for s in jobs["check"]["steps"])
    assert 'release.py check "$GITHUB_REF_NAME"' in check_step
    assert jobs["test"]["needs"] == "check"
    for name in ("image", "chart"):
        assert set(jobs[name]["needs"]) == {"check", "test"}, name
    assert set(jobs["release"]["needs"]) >= {"image", "chart"}
    steps = {s.get("uses", "").split("@")[0]: s for s in jobs["image"]["steps"]}
    for action in ("docker/setup-qemu-action", "docker/setup-buildx-action",
                   "docker/login-action", "docker/build-push-action"):
        assert action in steps, action
    build = steps["docker/build-push-action"]["with"]
    assert build["platforms"] == "linux/amd64,linux/arm64" and build["push"] is True
    assert build["file"] == "Dockerfile.multistage"
    assert {line.split("=")[0] for line in build["build-args"].splitlines()} == {
        "VERSION", "REVISION"}
    runs = " ".join(s.get("run", "") for job in jobs.values() for s in job["steps"])
    assert "helm package deploy/helm/accelerator-device-plugin" in runs
    assert '--version "$VERSION"' in runs and '--app-version "$VERSION"' in runs
    assert "release.py notes" in runs and "gh release create" in runs


def test_release_workflow_pins_every_action_at_least_by_major_version():
    text = (REPO / ".github" / "workflows" / "release.yml").read_text()
    uses = re.findall(r"uses:\s*(\S+)", text)
    assert uses
    for action in uses:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+@(v\d+(\.\d+)*|[0-9a-f]{40})", action), action
