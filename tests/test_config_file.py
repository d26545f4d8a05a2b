"""``--config FILE``: a YAML mapping of flag names, below flags and variables, checked like them."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from operator import attrgetter
from pathlib import Path

import pytest

from plugin.cli.config import Settings, parse

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "deploy" / "config.example.yaml"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ACCELERATOR_DP_* variable of the machine running the tests may leak into them."""
    for name in list(os.environ):
        if name.startswith("ACCELERATOR_DP_") or name == "NODE_NAME":
            monkeypatch.delenv(name)


def write(tmp_path: Path, text: str, name: str = "config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def source(settings: Settings, key: str) -> str | None:
    return next((o.source for o in settings.origins if o.key == key), None)


def refused(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one line ``parse`` exits 2 with."""
    with pytest.raises(SystemExit) as exited:
        parse(args)
    assert exited.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


# --- precedence: flag, then variable, then file, then default -------------------------------


@pytest.mark.parametrize(
    ("flag", "env", "file"), list(itertools.product([False, True], repeat=3)))
def test_precedence_in_every_combination(tmp_path, monkeypatch, flag, env, file) -> None:
    config = write(tmp_path, "metrics-port: 1003\n" if file else "log-level: info\n")
    args = ["serve", "--config", str(config)] + (["--metrics-port", "1001"] if flag else [])
    if env:
        monkeypatch.setenv("ACCELERATOR_DP_METRICS_PORT", "1002")
    settings = parse(args)
    if flag:
        assert (settings.metrics_port, source(settings, "metrics-port")) == (1001, "flag")
    elif env:
        assert (settings.metrics_port, source(settings, "metrics-port")) == (
            1002, "env ACCELERATOR_DP_METRICS_PORT")
    elif file:
        assert (settings.metrics_port, source(settings, "metrics-port")) == (
            1003, f"file {config} (metrics-port)")
    else:
        assert settings.metrics_port is None and source(settings, "metrics-port") is None


def test_a_flag_that_repeats_the_default_still_wins_over_the_file(tmp_path) -> None:
    config = write(tmp_path, "backend: intel\ncdi: true\n")
    settings = parse(["serve", "--config", str(config), "--backend", "auto", "--cdi", "false"])
    assert (settings.backend, source(settings, "backend")) == ("auto", "flag")
    assert (settings.cdi, source(settings, "cdi")) == (False, "flag")


def test_a_variable_that_repeats_the_default_still_wins_over_the_file(tmp_path,
                                                                      monkeypatch) -> None:
    config = write(tmp_path, "log-level: debug\n")
    monkeypatch.setenv("ACCELERATOR_DP_LOG_LEVEL", "info")
    assert parse(["serve", "--config", str(config)]).log_level == "info"


def test_the_file_can_be_named_by_its_variable_and_the_flag_wins(tmp_path,
                                                                 monkeypatch) -> None:
    by_env = write(tmp_path, "backend: aws\n", "env.yaml")
    by_flag = write(tmp_path, "backend: alveo\n", "flag.yaml")
    monkeypatch.setenv("ACCELERATOR_DP_CONFIG", str(by_env))
    settings = parse(["discover"])
    assert settings.backend == "aws"
    assert source(settings, "config") == "env ACCELERATOR_DP_CONFIG"
    assert parse(["discover", "--config", str(by_flag)]).backend == "alveo"


def test_every_setting_the_file_gives_is_applied(tmp_path) -> None:
    config = write(tmp_path, "device-plugin-dir: /tmp/dp\nresource-name: example.com/fpga\n"
                   "register-timeout: 7\nretry-attempts: 2\nhealth-interval: 0.25\n")
    settings = parse(["serve", "--config", str(config)])
    assert settings.device_plugin_dir == Path("/tmp/dp")
    assert settings.resource_name == "example.com/fpga"
    assert settings.retry.register_timeout == 7.0 and settings.retry.attempts == 2
    assert settings.health_interval == 0.25


def test_file_values_meet_the_checks_across_settings(tmp_path, capsys) -> None:
    config = write(tmp_path, "resource-mode: afu\nbackend: units\n")
    assert "units backend" in refused(["serve", "--config", str(config)], capsys)


def test_an_empty_file_sets_nothing(tmp_path) -> None:
    config = write(tmp_path, "# nothing yet\n")
    settings = parse(["serve", "--config", str(config)])
    assert [o.key for o in settings.origins] == ["config"]
    assert settings.backend == "auto"


# --- one file for serve and discover --------------------------------------------------------


def test_a_key_only_serve_has_is_checked_but_not_applied_by_discover(tmp_path,
                                                                      capsys) -> None:
    config = write(tmp_path, "backend: units\nregister-timeout: 5\n")
    settings = parse(["discover", "--config", str(config)])
    assert settings.backend == "units"
    assert source(settings, "register-timeout") is None
    bad = write(tmp_path, "backend: units\nregister-timeout: nan\n", "bad.yaml")
    line = refused(["discover", "--config", str(bad)], capsys)
    assert "line 2" in line and "'register-timeout'" in line and "not a finite number" in line


def test_a_healthcheck_setting_in_the_file_is_serves_too(tmp_path) -> None:
    # heartbeat-max-age was healthcheck's alone; serve's /livez now judges by it as well, so
    # the file sets it for serve (healthcheck itself reads no file).
    config = write(tmp_path, "heartbeat-max-age: 30\n")
    settings = parse(["serve", "--config", str(config)])
    assert settings.heartbeat_max_age == 30
    assert source(settings, "heartbeat-max-age") == f"file {config} (heartbeat-max-age)"


# --- refusals: one line, naming the file, the line and the key ------------------------------


def test_an_unknown_key_is_named_with_a_suggestion(tmp_path, capsys) -> None:
    config = write(tmp_path, "backend: intel\nmetrics_port: 8080\n")
    line = refused(["serve", "--config", str(config)], capsys)
    assert f"config file {config}, line 2, key 'metrics_port'" in line
    assert "did you mean 'metrics-port'?" in line


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [("metrics-port", "70000", "between 1 and 65535"),
     ("backend", "gpu", "'gpu' is not one of auto, intel"),
     ("api-versions", "v2", "comma-separated list"),
     ("register-timeout", "nan", "not a finite number"),
     ("resource-name", "accelerator", "exactly one '/'"),
     ("socket-name", "kubelet.sock", "other than kubelet.sock"),
     ("cdi", "maybe", "not true or false"),
     ("accel-nbunits", "-1", "between 0 and 4096")],
)
def test_a_bad_value_is_refused_in_the_words_of_its_variable(tmp_path, monkeypatch, capsys,
                                                              key, value, words) -> None:
    config = write(tmp_path, f"log-level: info\n{key}: '{value}'\n")
    from_file = refused(["serve", "--config", str(config)], capsys)
    assert f"config file {config}, line 2, key '{key}': " in from_file
    assert words in from_file
    variable = "ACCELERATOR_DP_" + key.replace("-", "_").upper()
    monkeypatch.setenv(variable, value)
    from_env = refused(["serve"], capsys)
    # One converter and one choices check for both: the same reason, word for word.
    assert from_file.split(f"key '{key}': ", 1)[1] == from_env.split(f"{variable}: ", 1)[1]


def test_a_bad_value_is_refused_even_where_a_flag_overrides_it(tmp_path, capsys) -> None:
    config = write(tmp_path, "metrics-port: eighty\n")
    line = refused(["serve", "--config", str(config), "--metrics-port", "8080"], capsys)
    assert "key 'metrics-port'" in line


def test_the_file_cannot_name_another_file(tmp_path, capsys) -> None:
    config = write(tmp_path, "config: /etc/other.yaml\n")
    line = refused(["serve", "--config", str(config)], capsys)
    assert f"config file {config}, line 1, key 'config'" in line


def test_a_key_given_twice_is_refused(tmp_path, capsys) -> None:
    config = write(tmp_path, "backend: intel\ncdi: true\nbackend: aws\n")
    line = refused(["serve", "--config", str(config)], capsys)
    assert "line 3, key 'backend': given twice (first on line 1)" in line


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [("backend: intel\nmetrics-port: 80: 80\n", 2, "mapping values are not allowed here"),
     ("backend: intel\n\tcdi: true\n", 2, "cannot start any token"),
     ("backend: [intel\ncdi: true\n", 2, "expected ',' or ']'"),
     ("backend: intel\n---\ncdi: true\n", 2, "single document")],
)
def test_malformed_yaml_is_refused_with_its_line(tmp_path, capsys, text, line, words) -> None:
    config = write(tmp_path, text)
    refusal = refused(["serve", "--config", str(config)], capsys)
    assert f"config file {config}, line {line}: malformed YAML: " in refusal
    assert words in refusal


@pytest.mark.parametrize(
    ("text", "found"),
    [("- backend\n- intel\n", "a list"), ("backend=intel\n", "the value 'backend=intel'")],
)
def test_a_file_that_is_not_a_mapping_is_refused(tmp_path, capsys, text, found) -> None:
    config = write(tmp_path, text)
    line = refused(["serve", "--config", str(config)], capsys)
    assert f"config file {config}, line 1: expected a mapping of flag names to values, " \
           f"found {found}" in line


def test_a_nested_mapping_is_refused(tmp_path, capsys) -> None:
    config = write(tmp_path, "backend:\n  name: intel\n")
    line = refused(["serve", "--config", str(config)], capsys)
    assert "line 2, key 'backend': expected a value or a list of values, found a mapping" \
        in line


def test_a_missing_file_is_refused(tmp_path, capsys) -> None:
    missing = tmp_path / "absent.yaml"
    line = refused(["serve", "--config", str(missing)], capsys)
    assert line.endswith(f"config file {missing}: cannot read it: No such file or directory")


def test_a_directory_or_binary_file_is_refused(tmp_path, capsys) -> None:
    assert "Is a directory" in refused(["serve", "--config", str(tmp_path)], capsys)
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00backend")
    assert "not UTF-8 text" in refused(["discover", "--config", str(binary)], capsys)


def test_a_refusal_exits_2_in_one_line_from_the_real_command(tmp_path) -> None:
    config = write(tmp_path, "backend: intel\nmetrics-port: many\n")
    result = subprocess.run(
        [sys.executable, "-m", "plugin", "serve", "--config", str(config)],
        capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, timeout=60)
    assert result.returncode == 2
    assert result.stderr == (f"accelerator-device-plugin serve: error: config file {config}, "
                             "line 2, key 'metrics-port': 'many' is not a port number\n")
    assert result.stdout == ""


# --- values: lists, booleans, text that YAML 1.1 would have turned into something else ------


@pytest.mark.parametrize(
    "text",
    ["api-versions: [v1alpha1, v1beta1]\n", "api-versions:\n  - v1alpha1\n  - v1beta1\n",
     "api-versions: v1alpha1,v1beta1\n", "api-versions: 'v1alpha1, v1beta1'\n"],
)
def test_a_list_is_a_yaml_list_or_the_flags_text(tmp_path, text) -> None:
    settings = parse(["serve", "--config", str(write(tmp_path, text))])
    assert settings.api_versions == ("v1alpha1", "v1beta1")


def test_a_list_for_a_single_value_is_refused(tmp_path, capsys) -> None:
    config = write(tmp_path, "backend: [intel, aws]\n")
    assert "key 'backend': takes one value, not a list" in refused(
        ["serve", "--config", str(config)], capsys)


def test_a_list_is_checked_like_the_flag(tmp_path, capsys) -> None:
    for text, words in [("api-versions: []\n", "comma-separated list"),
                        ("api-versions: [v1beta1, v1beta1]\n", "names a generation twice"),
                        ("api-versions: [v1beta1, v2]\n", "comma-separated list")]:
        config = write(tmp_path, text)
        assert words in refused(["serve", "--config", str(config)], capsys)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("true", True), ("false", False), ("yes", True), ("no", False), ("on", True),
     ("off", False), ("'true'", True), ('"false"', False), ("1", True), ("0", False),
     ("True", True), ("FALSE", False)],
)
def test_booleans(tmp_path, value, expected) -> None:
    settings = parse(["serve", "--config", str(write(tmp_path, f"cdi: {value}\n"))])
    assert settings.cdi is expected
    assert source(settings, "cdi") is not None


@pytest.mark.parametrize(
    ("text", "field", "expected"),
    [("node-name: no\n", "node_name", "no"),
     ("socket-name: on\n", "socket_name", "on"),
     ("dra-driver-name: yes.example.com\n", "dra_driver_name", "yes.example.com"),
     ("metrics-address: 0.0.0.0\n", "metrics_address", "0.0.0.0"),
     ("metrics-port: 08080\n", "metrics_port", 8080),
     ("retry-attempts: 010\n", "retry.attempts", 10),
     ("register-timeout: 1:30\n", None, "'1:30' is not a number of seconds")],
)
def test_bool_like_and_number_like_text_reaches_the_flag_as_written(tmp_path, capsys, text,
                                                                     field, expected) -> None:
    # YAML 1.1 reads `no` as false, 010 as octal 8 and 1:30 as 90: the flags never see those.
    args = ["serve", "--config", str(write(tmp_path, text))]
    if field is None:
        assert expected in refused(args, capsys)
    else:
        assert attrgetter(field)(parse(args)) == expected


def test_a_bool_like_word_is_not_a_choice(tmp_path, capsys) -> None:
    config = write(tmp_path, "log-level: off\n")
    assert "'off' is not one of debug, info, warning, error" in refused(
        ["serve", "--config", str(config)], capsys)


def test_a_null_is_not_a_way_to_unset(tmp_path, capsys) -> None:
    config = write(tmp_path, "metrics-port: ~\n")
    assert "key 'metrics-port': '~' is not a port number" in refused(
        ["serve", "--config", str(config)], capsys)


# --- the example shipped in deploy/ ---------------------------------------------------------


def test_the_example_file_loads_and_every_key_in_it_is_applied() -> None:
    settings = parse(["serve", "--config", str(EXAMPLE)])
    from_file = {o.key for o in settings.origins if o.source.startswith("file ")}
    keys = {line.split(":", 1)[0] for line in EXAMPLE.read_text().splitlines()
            if line and not line.startswith((" ", "#"))}
    assert keys and from_file == keys
    assert settings.backend == "intel" and settings.resource_mode == "afu"
    assert settings.cdi is True and settings.metrics_port == 8080
    assert settings.api_versions == ("v1beta1", "v1alpha2")


def test_the_examples_commented_out_keys_load_too(tmp_path) -> None:
    text = EXAMPLE.read_text()
    commented = [line[2:] for line in text.splitlines()
                 if re.fullmatch(r"# [a-z-]+: \S+", line)]
    assert len(commented) >= 3
    settings = parse(["serve", "--config", str(write(tmp_path, text + "\n".join(commented)))])
    from_file = {o.key for o in settings.origins if o.source.startswith("file ")}
    assert {line.split(":")[0] for line in commented} <= from_file
