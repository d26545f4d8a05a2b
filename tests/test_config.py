"""Flags and environment variables: defaults a b<>com user expects, one-line errors, exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from plugin.cli.config import DEFAULT_GENERATIONS, parse
from plugin.serving.dra.apiserver import REQUEST_TIMEOUT


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
        (["serve", "--register-timeout", "nan"], {}, "not a finite number"),
        (["serve", "--rescan-interval", "inf"], {}, "not a finite number"),
        (["serve"], {"ACCELERATOR_DP_KUBELET_CHECK_INTERVAL": "-inf"}, "not a finite number"),
        (["serve", "--health-interval", "1e-9"], {}, "between 0.05 and 60 seconds"),
        (["serve", "--retry-max-backoff", "0"], {}, "between 0.01 and 300 seconds"),
        (["serve", "--api-request-timeout", "0"], {}, "between 0.1 and 300 seconds"),
        (["serve", "--heartbeat-interval", "1e12"], {}, "between 0.1 and 3600 seconds"),
        (["healthcheck", "--heartbeat-file", "/x", "--heartbeat-max-age", "nan"], {},
         "not a finite number"),
        (["serve", "--device-plugin-dir", "/tmp/" + "d" * 90], {}, "at most 107"),
        (["serve", "--socket-name", "s" * 110], {}, "at most 107"),
        (["serve", "--resource-mode", "afu", "--device-plugin-dir", "/tmp/" + "d" * 60], {},
         "the longest socket path"),
        (["serve", "--resource-mode", "afu", "--backend", "units"], {}, "units backend"),
        (["serve", "--resource-mode", "afu", "--backend", "none"], {},
         "--backend auto, intel, alveo"),
        (["discover", "--resource-mode", "afu", "--backend", "aws"], {}, "aws backend"),
        (["serve", "--api", "dri"], {}, "invalid choice"),
        (["serve", "--api", "dra"], {}, "needs --node-name"),
        (["serve", "--node-name", "Node_1"], {}, "not a DNS subdomain"),
        (["serve", "--dra-driver-name", "a" * 40 + ".b" * 15], {}, "63 characters"),
        (["serve", "--api", "auto"], {"NODE_NAME": "-bad-"}, "not a DNS subdomain"),
        (["serve", "--replicas", "b-com.com/accelerator=65"], {}, "from 1 to 64"),
        (["serve", "--replicas", "b-com.com/accelerator"], {}, "is not RESOURCE=N"),
        (["serve"], {"ACCELERATOR_DP_REPLICAS": "fpga=2"}, "ACCELERATOR_DP_REPLICAS"),
        (["serve", "--replicas", "foo"], {},
         "argument --replicas: 'foo' is not RESOURCE=N (e.g. b-com.com/accelerator=4"),
        (["discover", "--replicas", "*=0"], {}, "from 1 to 64"),
        (["serve", "--dra-share", "aws=2"], {}, "aws devices cannot be shared"),
        (["serve", "--dra-share", "alveo=0"], {}, "(off shares nothing)"),
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


@pytest.mark.parametrize(
    ("command", "variable"),
    [(["discover"], "ACCELERATOR_DP_LOG_LEVEL"), (["loader"], "ACCELERATOR_DP_LOG_FORMAT"),
     (["healthcheck", "--heartbeat-file", "/x"], "ACCELERATOR_DP_HEARTBEAT_MAX_AGE")],
)
def test_an_environment_error_names_the_subcommand_that_runs(command, variable) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "plugin", *command], capture_output=True, text=True,
        env={"PATH": "/usr/bin:/bin", variable: "nonsense"}, timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.startswith(f"accelerator-device-plugin {command[0]}: error: "), (
        result.stderr)
    assert variable in result.stderr


def test_a_variable_only_serve_reads_does_not_break_other_commands(tmp_path: Path) -> None:
    heartbeat = tmp_path / "beat"
    heartbeat.write_text("1\n")
    env = {"PATH": "/usr/bin:/bin", "ACCELERATOR_DP_HEALTH_INTERVAL": "nan"}
    ok = subprocess.run(
        [sys.executable, "-m", "plugin", "healthcheck", "--heartbeat-file", str(heartbeat)],
        capture_output=True, text=True, env=env, timeout=60)
    assert ok.returncode == 0, ok.stderr


def test_a_flag_given_on_the_command_line_overrides_a_bad_variable(monkeypatch) -> None:
    monkeypatch.setenv("ACCELERATOR_DP_HEALTH_INTERVAL", "nan")
    assert parse(["serve", "--health-interval", "0.25"]).health_interval == 0.25


def test_afu_socket_names_fit_a_unix_socket_under_the_default_directory() -> None:
    settings = parse(["serve", "--resource-mode", "afu"])
    assert settings.resource_mode == "afu"


def test_a_missing_sysfs_root_is_warned_about_but_not_fatal(tmp_path: Path) -> None:
    missing = tmp_path / "no-sys"
    result = subprocess.run(
        [sys.executable, "-m", "plugin", "discover", "--sysfs-root", str(missing),
         "--dev-root", str(tmp_path)],
        capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, timeout=60)
    assert result.returncode == 0
    assert f"--sysfs-root {missing} is not a directory" in result.stderr
    assert "(no accelerators found)" in result.stdout


def test_dra_settings_default_to_the_downward_api(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "node-7.example")
    settings = parse(["serve"])
    assert settings.api == "device-plugin"
    assert settings.node_name == "node-7.example"
    assert settings.dra_driver_name == "accelerator.b-com.com"
    assert settings.kubeconfig is None and settings.dra_state_dir is None
    assert settings.api_request_timeout == REQUEST_TIMEOUT == 10.0
    monkeypatch.setenv("ACCELERATOR_DP_NODE_NAME", "node-8")
    assert parse(["serve", "--kubeconfig", "/k"]).node_name == "node-8"
    monkeypatch.setenv("ACCELERATOR_DP_API_REQUEST_TIMEOUT", "30")
    assert parse(["serve"]).api_request_timeout == 30.0
    assert parse(["serve", "--api-request-timeout", "2.5"]).api_request_timeout == 2.5
