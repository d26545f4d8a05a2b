"""The rule that says whether a node's container runtime applies CDI, from the Node's
``status.nodeInfo.containerRuntimeVersion`` and ``--runtime-cdi``."""

from __future__ import annotations

import pytest

from plugin.serving.runtime_cdi import AUTO, DISABLED, ENABLED, judge, parse


@pytest.mark.parametrize(("text", "name", "release"), [
    ("containerd://1.6.20", "containerd", (1, 6, 20)),
    ("containerd://v1.7.2", "containerd", (1, 7, 2)),
    ("containerd://1.6.20~ds1", "containerd", (1, 6, 20)),  # Debian's
    ("containerd://2.0.0-rc.1", "containerd", (2, 0, 0)),
    ("cri-o://1.22.1", "cri-o", (1, 22, 1)),
    ("CRI-O://1.30", "cri-o", (1, 30, 0)),
    ("docker://24.0.7", "docker", (24, 0, 7)),
    ("remote://", "remote", None),
    ("containerd://", "containerd", None),
    ("containerd://devel", "containerd", None),
    ("1.7.2", "", (1, 7, 2)),
    ("", "", None),
    (None, "", None),
    ("  containerd://1.7.0  ", "containerd", (1, 7, 0)),
])
def test_odd_strings_parse_without_raising(text, name, release):
    runtime = parse(text)
    assert (runtime.name, runtime.release) == (name, release)


@pytest.mark.parametrize(("text", "declared", "applies"), [
    # containerd: none before 1.7, 1.7 only when declared, 2.0 on unless declared off.
    ("containerd://1.6.20", AUTO, False),
    ("containerd://1.6.20", ENABLED, False),
    ("containerd://v1.7.2", AUTO, None),
    ("containerd://v1.7.2", ENABLED, True),
    ("containerd://1.7.30", DISABLED, False),
    ("containerd://2.0.0", AUTO, True),
    ("containerd://2.1.4", DISABLED, False),
    # CRI-O: 1.23 on.
    ("cri-o://1.22.1", AUTO, False),
    ("cri-o://1.22.1", ENABLED, False),
    ("cri-o://1.23.0", AUTO, True),
    ("cri-o://1.30.3", DISABLED, False),
    # Anything else: no unless declared.
    ("docker://24.0.7", AUTO, None),
    ("docker://24.0.7", ENABLED, True),
    ("remote://", AUTO, None),
    ("containerd://", AUTO, None),
    ("", AUTO, None),
    ("", ENABLED, True),
    (None, AUTO, None),
    (None, ENABLED, True),
    (None, DISABLED, False),
])
def test_the_rule(text, declared, applies):
    assert judge(text, declared).applies is applies


def test_the_reasons_name_the_runtime_and_the_rule():
    assert judge("containerd://1.6.20").why == \
        "runtime containerd://1.6.20 does not apply CDI (containerd < 1.7)"
    assert judge("cri-o://1.22.1").why == "runtime cri-o://1.22.1 does not apply CDI (CRI-O < 1.23)"
    assert "enable_cdi = true" in judge("containerd://1.7.2").why
    assert "--runtime-cdi enabled" in judge("containerd://1.7.2").why
    assert "cannot change that" in judge("containerd://1.6.20", ENABLED).why
    assert "could not be read" in judge(None).why
    assert "unknown runtime" in judge("docker://24.0.7").why


def test_the_condition_is_false_where_it_cannot_and_unknown_where_it_cannot_tell():
    status, reason, message = judge("containerd://1.6.20").condition
    assert (status, reason) == ("False", "RuntimeWithoutCDI")
    assert message.startswith("runtime containerd://1.6.20 does not apply CDI")
    assert "may start without this device" in message
    assert judge("docker://24.0.7").condition[:2] == ("Unknown", "RuntimeCDIUnknown")
    assert judge("containerd://2.0.0").condition[0] == "True"


def test_a_node_never_read_is_told_apart_from_one_that_reports_nothing():
    """Under ``auto`` an unread Node is decided after the API server's own checks (whose
    refusal is then the likelier cause); a Node read with no runtime is an unknown runtime."""
    assert judge(None).read is False and judge(None, ENABLED).read is False
    assert judge("").read is True and judge("containerd://1.6.20").read is True
