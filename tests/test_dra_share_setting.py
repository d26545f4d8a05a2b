"""``--dra-share``: the families DRA publishes for sharing, and every malformed value refused
at start in one line naming the family and why."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from plugin.cli.config import parse
from plugin.cli.sources import describe
from plugin.serving.dra.share_setting import (
    FamilyShare,
    announce,
    parse_shares,
    setting_of,
    sharing_on,
)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACCELERATOR_DP_DRA_SHARE", raising=False)
    monkeypatch.delenv("ACCELERATOR_DP_CONFIG", raising=False)


def test_nothing_is_shared_by_default() -> None:
    settings = parse(["serve"])
    assert settings.dra_share == ()
    assert not sharing_on(settings.dra_share)
    assert setting_of(settings.dra_share, "intel") == 0


def test_image_a_number_and_off_per_family() -> None:
    settings = parse(["serve", "--dra-share", "intel=image, alveo=4"])
    assert settings.dra_share == (FamilyShare("intel", None), FamilyShare("alveo", 4))
    assert setting_of(settings.dra_share, "intel") is None
    assert setting_of(settings.dra_share, "alveo") == 4
    assert setting_of(settings.dra_share, "aws") == 0
    assert sharing_on(settings.dra_share)
    assert "dra-share=intel=image,alveo=4 [flag]" in describe(settings.origins)


@pytest.mark.parametrize("text", ["alveo=1", "intel=off", "intel=OFF,alveo=1", ""])
def test_one_context_or_off_shares_nothing(text: str) -> None:
    shares = parse_shares(text)
    assert not sharing_on(shares)
    assert setting_of(shares, "alveo") == 0 and setting_of(shares, "intel") == 0


def test_the_variable_and_the_file_take_the_same_values(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("dra-share: [intel=image, alveo=4]\n")
    assert parse(["serve", "--config", str(config)]).dra_share == (
        FamilyShare("intel", None), FamilyShare("alveo", 4))
    config.write_text("dra-share: alveo=2\n")
    assert parse(["serve", "--config", str(config)]).dra_share == (FamilyShare("alveo", 2),)
    monkeypatch.setenv("ACCELERATOR_DP_DRA_SHARE", "intel=3")
    assert parse(["serve", "--config", str(config)]).dra_share == (FamilyShare("intel", 3),)


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("aws=2", "aws devices cannot be shared: only intel and alveo can"),
        ("units=image", "units devices cannot be shared"),
        ("intel=image,gpu=2", "'gpu' is not a device family this driver knows"),
        ("alveo=0", "alveo=0: the number of contexts must be between 1 and 4096"),
        ("alveo=-3", "alveo=-3: expected image, off or a number of contexts"),
        ("intel=many", "intel=many: expected image, off or a number of contexts"),
        ("intel=2.5", "intel=2.5: expected image"),
        ("intel=image,alveo=2,intel=3", "intel is given twice"),
        ("alveo", "'alveo' is not FAMILY=VALUE"),
        ("=4", "'=4' is not FAMILY=VALUE"),
        ("alveo=99999", "between 1 and 4096"),
    ],
)
def test_a_bad_value_exits_2_in_one_line_naming_the_family(value: str, words: str) -> None:
    for args, env in ((["serve", "--dra-share", value], {}),
                      (["serve"], {"ACCELERATOR_DP_DRA_SHARE": value})):
        result = subprocess.run([sys.executable, "-m", "plugin", *args], capture_output=True,
                                text=True, env={"PATH": "/usr/bin:/bin", **env}, timeout=60)
        assert result.returncode == 2
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert words in lines[0]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("dra-share: [intel=image, aws=2]\n", "aws devices cannot be shared"),
        ("dra-share: {intel: image}\n", "expected a value or a list of values, found a mapping"),
        ("dra-share: intel=0\n", "intel=0: the number of contexts must be between 1 and 4096 "
                                 "(off shares nothing)"),
        ("dra-share: 3\n", "'3' is not FAMILY=VALUE"),
    ],
)
def test_a_bad_value_in_the_config_file_exits_2_in_one_line_naming_the_key(
        tmp_path: Path, text: str, words: str) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(text)
    result = subprocess.run([sys.executable, "-m", "plugin", "serve", "--config", str(config)],
                            capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"},
                            timeout=60)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"accelerator-device-plugin serve: error: config file {config}, "
                           "line 1, key 'dra-share': ")
    assert words in line


def test_the_file_takes_a_one_family_list(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("dra-share: [intel=image]\n")
    assert parse(["serve", "--config", str(config)]).dra_share == (FamilyShare("intel", None),)


def test_the_setting_is_said_to_do_nothing_where_the_node_is_never_served_through_dra(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        announce(parse_shares("intel=image"), "device-plugin")
        for api in ("dra", "auto"):
            announce(parse_shares("intel=image,alveo=4"), api)
        announce(parse_shares("intel=off,alveo=1"), "device-plugin")
        announce((), "device-plugin")
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "--dra-share has no effect with --api device-plugin: it applies to "
                          "the DRA driver only (the device plugin shares devices through "
                          "--replicas)")]


def test_serve_on_the_device_plugin_warns_that_the_setting_does_nothing(tmp_path: Path) -> None:
    directory = tmp_path / "dp"
    process = subprocess.Popen(
        [sys.executable, "-m", "plugin", "serve", "--backend", "units", "--accel-nbunits", "2",
         "--device-plugin-dir", str(directory), "--log-format", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={"PATH": "/usr/bin:/bin", "ACCELERATOR_DP_DRA_SHARE": "alveo=4"})
    try:
        deadline = time.monotonic() + 30
        while not (directory / "accelerator.sock").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (directory / "accelerator.sock").exists()
        process.send_signal(signal.SIGTERM)
        _out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0
    said = [json.loads(line) for line in err.splitlines()]
    warned = [e for e in said if e["message"].startswith("--dra-share has no effect")]
    assert [e["level"] for e in warned] == ["warning"], err
