"""How long a stopping pod may take: the chart and the programming component give the DRA
driver a ``--stop-timeout`` that outlasts a load under way, and the pod a
``terminationGracePeriodSeconds`` that outlasts the driver's wait and the loader's stop.

On SIGTERM the driver waits up to ``--stop-timeout`` for its loads and clears and cuts off
what is left (the card quarantined); the loader, a native sidecar, is stopped once the driver
has exited and finishes the load it runs; the kubelet kills what still runs at the end of the
grace period. A roll during a load of up to ``--program-timeout`` must therefore find both
long enough. That the kubelet stops the sidecar after the driver, within one grace period,
only a real cluster shows (docs/deploying.md).
"""

from __future__ import annotations

import copy
import json
import math
import os
from typing import Any

import pytest
from deploy_support import daemonset, env, minor, pod_spec
from helm_render import CHART, HelmRefused, config_file, example_values, one
from helm_render import render as helm_render
from k8s_schemas import validate

from plugin.cli import config, converters
from plugin.programming.remote import client
from plugin.serving.dra.stopping import DEFAULT_STOP_TIMEOUT

PROGRAMMING = {"config": {"api": "auto"}, "programming": {"enabled": True}}
STOP_MARGIN = 10
"""Seconds the chart adds to programming.timeoutSeconds for the stop timeout."""
GRACE_MARGIN = 15
"""Seconds the chart adds to the longer of the stop and program timeouts for the grace
period: the driver's own stop after its wait, then the loader's."""
KUBERNETES_DEFAULT_GRACE = 30


def _programming(timeout: float | None = None, stop: float | None = None,
                 **top: Any) -> dict[str, Any]:
    """Programming on, with this program timeout, config.stop-timeout and top-level values."""
    values = copy.deepcopy(PROGRAMMING)
    if timeout is not None:
        values["programming"]["timeoutSeconds"] = timeout
    if stop is not None:
        values["config"]["stop-timeout"] = stop
    values.update(top)
    return values


TWO_POOLS = [
    {"name": "slow", "nodeSelector": {"vendor": "amd"}, "config": {"stop-timeout": 600}},
    {"name": "fast", "nodeSelector": {"vendor": "intel"}}]


def _stopping(values: dict[str, Any]) -> list[tuple[Any, Any]]:
    """(terminationGracePeriodSeconds, config.yaml's stop-timeout) of each DaemonSet."""
    objects = helm_render(values)
    return [(ds["spec"]["template"]["spec"].get("terminationGracePeriodSeconds"),
             config_file(objects, ds).get("stop-timeout"))
            for ds in objects if ds["kind"] == "DaemonSet"]


def _serve_settings(variables: dict[str, str], file: dict[str, Any],
                    tmp_path: Any) -> config.Settings:
    """What serve reads from these variables and this config.yaml (no other variable)."""
    import yaml

    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(file))
    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update({k: v for k, v in variables.items() if k != "ACCELERATOR_DP_CONFIG"})
        os.environ["ACCELERATOR_DP_CONFIG"] = str(path)
        return config.parse(["serve"])
    finally:
        os.environ.clear()
        os.environ.update(saved)


# --- the chart: automatic -------------------------------------------------------------------


@pytest.mark.parametrize("values", [{}, {"config": {"api": "auto"}},
                                    {**PROGRAMMING, "programming": {"enabled": False}}])
def test_without_programming_the_pod_default_stays(values):
    """Nothing is loaded, so nothing is waited for: serve's 25 s under Kubernetes' 30 s."""
    assert _stopping(values) == [(None, None)]
    assert DEFAULT_STOP_TIMEOUT < KUBERNETES_DEFAULT_GRACE


@pytest.mark.parametrize(("timeout", "stop", "grace"), [
    (120, 130, 145),     # the defaults
    (300, 310, 325),
    (90.5, 100.5, 116),  # the grace period is whole seconds, rounded up
    (3595, 3600, 3615),  # serve's --stop-timeout takes at most 3600
    (3600, 3600, 3615),  # the loader's load, not the driver's wait, is then the longer
])
def test_with_programming_stop_timeout_and_grace_follow_the_program_timeout(timeout, stop,
                                                                             grace):
    values = _programming(timeout)
    assert _stopping(values) == [(grace, stop)]
    assert stop == min(timeout + STOP_MARGIN, 3600)
    assert grace == math.ceil(max(stop, timeout)) + GRACE_MARGIN


def test_serve_reads_the_stop_timeout_and_outlasts_a_load_it_waits_for(tmp_path):
    """The driver waits for the loader's answer up to --program-timeout plus the answer's
    and the connection's allowances: the automatic stop timeout covers a load that began
    just before SIGTERM, and ends before the grace period does."""
    objects = helm_render(example_values("programming"))
    ds = one(objects, "DaemonSet")
    (driver,) = ds["spec"]["template"]["spec"]["containers"]
    variables = {e["name"]: e["value"] for e in driver["env"] if "value" in e}
    variables["NODE_NAME"] = "fpga-node-1"
    settings = _serve_settings(variables, config_file(objects, ds), tmp_path)
    longest_load = settings.program_timeout + client.ANSWER_GRACE + client.CONNECT_TIMEOUT
    assert longest_load <= settings.stop_timeout == 130
    assert settings.stop_timeout < ds["spec"]["template"]["spec"][
        "terminationGracePeriodSeconds"]


# --- the chart: what the user sets ---------------------------------------------------------


@pytest.mark.parametrize(("values", "expected"), [
    # A stop timeout of the user's wins; the grace period still outlasts the loader's load.
    (_programming(stop=60), [(135, 60)]),
    (_programming(stop=200), [(215, 200)]),
    # Without programming, a stop timeout of the user's brings its grace period along.
    ({"config": {"api": "auto", "stop-timeout": 60}}, [(75, 60)]),
    # A grace period of the user's wins, when above the stop timeout.
    (_programming(terminationGracePeriodSeconds=200), [(200, 130)]),
    ({"terminationGracePeriodSeconds": 45}, [(45, None)]),
    ({"terminationGracePeriodSeconds": int(DEFAULT_STOP_TIMEOUT) + 1},
     [(int(DEFAULT_STOP_TIMEOUT) + 1, None)]),
    # Per pool: each pool's stop timeout, and its grace period.
    (_programming(nodePools=TWO_POOLS), [(615, 600), (145, 130)]),
])
def test_what_the_user_sets_wins(values, expected):
    assert _stopping(values) == expected


@pytest.mark.parametrize(("values", "said"), [
    ({"config": {"api": "auto", "stop-timeout": 60}, "terminationGracePeriodSeconds": 60},
     "terminationGracePeriodSeconds: 60 is not above the stop-timeout, 60 s "
     "(config.stop-timeout)"),
    (_programming(terminationGracePeriodSeconds=100),
     "terminationGracePeriodSeconds: 100 is not above the stop-timeout, 130 s "
     "(programming.timeoutSeconds 120 + 10, set by the chart)"),
    ({"terminationGracePeriodSeconds": int(DEFAULT_STOP_TIMEOUT)},
     f"terminationGracePeriodSeconds: {int(DEFAULT_STOP_TIMEOUT)} is not above the "
     f"stop-timeout, {int(DEFAULT_STOP_TIMEOUT)} s (serve's default)"),
    (_programming(terminationGracePeriodSeconds=300, nodePools=TWO_POOLS),
     "terminationGracePeriodSeconds: 300 is not above the stop-timeout, 600 s "
     "(nodePools[0].config.stop-timeout)"),
])
def test_a_grace_period_not_above_the_stop_timeout_is_refused(values, said):
    with pytest.raises(HelmRefused) as refused:
        helm_render(values)
    message = str(refused.value)
    assert said in message
    assert "Raise terminationGracePeriodSeconds above" in message
    assert "or set" in message and "stop-timeout below" in message


def test_the_refusal_says_what_null_would_pick():
    with pytest.raises(HelmRefused, match=r"null picks 145\)"):
        helm_render(_programming(terminationGracePeriodSeconds=130))
    with pytest.raises(HelmRefused, match=r"null picks Kubernetes' default, 30\)"):
        helm_render({"terminationGracePeriodSeconds": 20})


# --- the values schema ----------------------------------------------------------------------


def _schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
    return loaded


def test_the_schema_takes_stop_timeout_within_serves_bounds():
    (option,) = [o for o in config.build_parser().commands["serve"].options
                 if o.key == "stop-timeout"]
    assert option.convert is converters.PROGRAM_TIMEOUT
    entry = _schema()["definitions"]["settings"]["properties"]["stop-timeout"]
    assert (entry["minimum"], entry["maximum"]) == (option.convert.low, option.convert.high)
    assert entry["type"] == "number"


@pytest.mark.parametrize("values", [
    {"config": {"stop-timeout": 0.5}},
    {"config": {"stop-timeout": 3601}},
    {"config": {"stop-timeout": "60"}},
    {"nodePools": [{"name": "a", "config": {"stop-timeout": 0}}]},
    {"terminationGracePeriodSeconds": 0},
    {"terminationGracePeriodSeconds": 60.5},
    {"terminationGracePeriodSeconds": "60"},
])
def test_the_schema_refuses_what_serve_or_kubernetes_would(values):
    with pytest.raises(HelmRefused, match="values don't meet the specifications of the schema"):
        helm_render(values)


def test_the_schema_takes_null_and_the_bounds():
    assert _stopping({"terminationGracePeriodSeconds": None}) == [(None, None)]
    assert _stopping({"config": {"stop-timeout": 1}}) == [(16, 1)]
    assert _stopping({"config": {"stop-timeout": 3600}}) == [(3615, 3600)]


# --- the programming component ---------------------------------------------------------------


def test_the_component_sets_what_the_chart_sets(rendered, tmp_path):
    programmed = rendered["dra+programming"]
    chart = one(helm_render(example_values("programming")), "DaemonSet")
    grace = pod_spec(programmed)["terminationGracePeriodSeconds"]
    assert grace == chart["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 145
    variables = env(programmed)
    assert variables["ACCELERATOR_DP_STOP_TIMEOUT"] == "130"
    settings = _serve_settings({**variables, "NODE_NAME": "fpga-node-1"}, {}, tmp_path)
    assert settings.stop_timeout == min(settings.program_timeout + STOP_MARGIN, 3600)
    assert grace == math.ceil(max(settings.stop_timeout, settings.program_timeout)) + (
        GRACE_MARGIN)
    # With a backend and metrics as well, the same.
    combined = rendered["dra+intel+programming+metrics"]
    assert pod_spec(combined)["terminationGracePeriodSeconds"] == grace
    assert env(combined)["ACCELERATOR_DP_STOP_TIMEOUT"] == "130"


@pytest.mark.parametrize("name", ["base", "dra", "intel", "dra+afu"])
def test_without_the_component_the_pod_default_stays(rendered, name):
    assert "terminationGracePeriodSeconds" not in pod_spec(rendered[name])
    assert "ACCELERATOR_DP_STOP_TIMEOUT" not in env(rendered[name])


# --- the rendered objects are valid Kubernetes -----------------------------------------------


def test_the_grace_period_validates_in_every_release_it_is_rendered_for(rendered, schema_sets):
    with_programming = [daemonset(rendered["dra+programming"]),
                        one(helm_render(_programming(terminationGracePeriodSeconds=600)),
                            "DaemonSet"),
                        one(helm_render(example_values("programming")), "DaemonSet")]
    device_plugin = one(helm_render({"terminationGracePeriodSeconds": 45}), "DaemonSet")
    checked = []
    for schemas in schema_sets:
        if minor(schemas.version) >= 21:
            assert validate(device_plugin, schemas) == [], schemas.version
            checked.append(schemas.version)
        if minor(schemas.version) >= 34:
            for ds in with_programming:
                assert validate(ds, schemas) == [], (schemas.version, ds["metadata"]["name"])
    assert checked[0] == "1.21"


def test_the_schemas_refuse_a_grace_period_that_is_not_a_number(schema_sets):
    """The check can fail: the field is checked, and a quoted number is refused."""
    ds = copy.deepcopy(one(helm_render({"terminationGracePeriodSeconds": 45}), "DaemonSet"))
    ds["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "45"
    newest = max(schema_sets, key=lambda s: minor(s.version))
    assert any("45" in e for e in validate(ds, newest))
