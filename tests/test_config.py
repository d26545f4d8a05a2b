"""Flags and environment variables: defaults a b<>com user expects, one-line errors, exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from plugin.config import DEFAULT_GENERATIONS, parse


def test_defaults_match_the_bcom_plugin() -> None:
    settings = parse(["serve"])
    assert settings.device_plugin_dir == Path("/var/lib/kubelet/device-plugins")
    assert settings.resource_name == "b-com.com/accelerator"
    assert settings.socket_name == "accelerator.sock"
    assert settings.accel_nbunits == 40
    assert settings.api_versions == DEFAULT_GENERATIONS


def test_single_dash_nbunits_and_generation_reordering() -> None:
    settings = parse(["serve", "-accel-nbunits", "8", "--api-versions", "v1alpha1,v1beta1"])
    assert settings.accel_nbunits == 8
    assert settings.api_versions == ("v1alpha1", "v1beta1")


def test_environment_sets_defaults_and_flags_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATOR_DP_ACCEL_NBUNITS", "12")
    monkeypatch.setenv("ACCELERATOR_DP_RESOURCE_NAME", "example.com/fpga")
    monkeypatch.setenv("ACCELERATOR_DP_LOG_FORMAT", "json")
    settings = parse(["serve", "--accel-nbunits", "3"])
    assert settings.accel_nbunits == 3
    assert settings.resource_name == "example.com/fpga"
    assert settings.log_format == "json"


@pytest.mark.parametrize(
    ("args", "env", "words"),
    [
        (["serve", "--bogus"], {}, "unrecognized arguments: --bogus"),
        (["serve", "--accel-nbunits", "-1"], {}, "between 0 and 4096"),
        (["serve", "--api-versions", "v2"], {}, "comma-separated list"),
        (["serve", "--resource-name", "accelerator"], {}, "exactly one '/'"),
        (["serve", "--resource-name", "kubernetes.io/fpga"], {}, "reserved"),
        (["serve", "--socket-name", "kubelet.sock"], {}, "other than kubelet.sock"),
        (["serve", "--backend", "gpu"], {}, "invalid choice"),
        (["serve", "--resource-prefix", "Bad_Domain"], {}, "not a DNS subdomain"),
        (["serve", "--metrics-port", "70000"], {}, "between 1 and 65535"),
        (["serve"], {"ACCELERATOR_DP_ACCEL_NBUNITS": "many"}, "ACCELERATOR_DP_ACCEL_NBUNITS"),
        (["healthcheck"], {}, "needs --heartbeat-file"),
    ],
)
def test_bad_input_exits_2_with_one_line(args, env, words) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "plugin", *args], capture_output=True, text=True,
        env={"PATH": "/usr/bin:/bin", **env}, timeout=60,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert words in lines[0]
