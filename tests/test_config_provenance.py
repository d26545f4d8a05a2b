"""Where each setting came from: in the real ``serve``'s start-up line and in ``discover``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from compat_tests.plugin_process import PluginProcess
from plugin.version import VERSION


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("ACCELERATOR_DP_") or name == "NODE_NAME":
            monkeypatch.delenv(name)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """Under /tmp: a socket path must fit in 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="prov", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_the_real_serve_logs_its_version_and_each_settings_source_at_start(
        short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = short_dir / "config.yaml"
    config.write_text("rescan-interval: 7\nhealth-interval: 2\nlog-level: info\n")
    monkeypatch.setenv("ACCELERATOR_DP_HEALTH_INTERVAL", "0.25")
    (short_dir / "dp").mkdir()
    plugin = PluginProcess(short_dir / "dp", short_dir, extra=["--config", str(config)])
    plugin.start()
    try:
        started = await plugin.wait_for_log(
            lambda e: str(e.get("message", "")).startswith("starting:"), timeout=60,
            what="the start-up line")
        assert await plugin.terminate(timeout=60) == 0
    finally:
        plugin.kill()
    line = started["message"]
    assert line.startswith(f"starting: version {VERSION}, backend units, "), line
    for part in (f"config={config} [flag]", "backend=units [flag]",
                 "health-interval=0.25 [env ACCELERATOR_DP_HEALTH_INTERVAL]",
                 f"rescan-interval=7.0 [file {config} (rescan-interval)]",
                 f"log-level=info [file {config} (log-level)]",
                 "log-format=json [flag]"):
        assert part in line, (part, line)
    # Settings at their defaults are not listed; the file's overridden value is not shown.
    assert "cdi=" not in line and "health-interval=2" not in line
    assert "\n" not in line
    assert sum("settings: " in str(e.get("message", "")) for e in plugin.entries()) == 1


def discover(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "plugin", "discover", *args],
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", **(env or {})})


def test_discover_names_each_settings_source_below_the_table(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("backend: units\naccel-nbunits: 2\nregister-timeout: 5\n")
    result = discover("--config", str(config), "--log-level", "warning",
                      env={"ACCELERATOR_DP_ACCEL_NBUNITS": "3"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[0] == "ID" and len(lines) == 1 + 3 + 2
    assert lines[-2] == ""
    assert lines[-1] == (f"settings: config={config} [flag], "
                         f"backend=units [file {config} (backend)], "
                         "accel-nbunits=3 [env ACCELERATOR_DP_ACCEL_NBUNITS], "
                         "log-level=warning [flag]")


def test_discover_json_keeps_stdout_the_device_list_and_says_settings_on_stderr(
        tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("backend: units\naccel-nbunits: 2\n")
    result = discover("--json", "--sysfs-root", "/nonexistent",
                      env={"ACCELERATOR_DP_CONFIG": str(config)})
    assert result.returncode == 0, result.stderr
    # stdout is what 0.1.0 printed: the list of devices, nothing else.
    assert [d["id"] for d in json.loads(result.stdout)] == ["0", "1"]
    assert (f"settings: config={config} [env ACCELERATOR_DP_CONFIG], "
            f"backend=units [file {config} (backend)], "
            f"accel-nbunits=2 [file {config} (accel-nbunits)], "
            "sysfs-root=/nonexistent [flag]") in result.stderr.splitlines()


def test_discover_at_every_default_adds_no_line() -> None:
    result = discover()
    assert result.returncode == 0, result.stderr
    assert "settings" not in result.stdout and result.stdout.splitlines()[-1] != ""
