"""A ``numa_node`` no kernel can have is "unknown" for that port alone, reported once.

Linux has at most 1024 NUMA nodes; a value beyond them (or beyond int64, which would fail
the whole ListAndWatch stream on the wire) must not reach the device model.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from conftest import by_id
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compat_tests.fake_sysfs import FakeNode
from plugin.discovery.backends.aws import AwsF1Backend
from plugin.discovery.backends.intel import IntelBackend
from plugin.discovery.backends.pcifn import numa_node
from plugin.discovery.backends.sysfs import Attr
from value_types.devices import MAX_NUMA_NODES

HUGE = "99999999999999999999"


@pytest.mark.parametrize("value", [HUGE, "1024", "4294967296", "-2", "-99999999999999999999"])
def test_an_impossible_numa_node_is_unknown_with_one_warning(
    intel_node: FakeNode, caplog: pytest.LogCaptureFixture, value: str,
) -> None:
    numa = intel_node.function_path("0000:d8:00.0") / "numa_node"
    numa.write_text(value + "\n")
    backend = IntelBackend(intel_node.config())
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            devices = by_id(backend.scan())
    assert devices["0000:d8:00.0"].numa_node is None
    assert devices["0000:d8:00.0"].healthy
    assert devices["0000:5e:00.0"].numa_node == 0, "the other ports keep their NUMA node"
    assert len(devices) == 6
    warned = [r.getMessage() for r in caplog.records if str(numa) in r.getMessage()]
    assert len(warned) == 1 and "NUMA node unknown" in warned[0], warned


def test_the_highest_numa_node_linux_allows_is_kept(intel_node: FakeNode) -> None:
    numa = intel_node.function_path("0000:d8:00.0") / "numa_node"
    numa.write_text(f"{MAX_NUMA_NODES - 1}\n")
    assert by_id(IntelBackend(intel_node.config()).scan())["0000:d8:00.0"].numa_node == 1023


def test_an_f1_slot_with_an_impossible_numa_node_is_served_without_one(
    f1_node: FakeNode,
) -> None:
    slot = "0000:00:0f.0"
    (f1_node.function_path(slot) / "numa_node").write_text(HUGE + "\n")
    devices = by_id(AwsF1Backend(f1_node.config()).scan())
    assert len(devices) == 8
    assert devices[slot].healthy and devices[slot].numa_node is None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.integers().map(str), st.text(max_size=30),
                 st.from_regex(r"\A[-+]?[0-9]{1,40}\Z")))
def test_any_numa_node_text_gives_a_node_linux_can_have_or_none(text: str) -> None:
    warnings: list[str] = []
    stripped = text.strip()
    attr = Attr(Path("/sys/x/numa_node"), stripped or None, "" if stripped else "empty")
    value = numa_node(attr, warnings)
    assert value is None or 0 <= value < MAX_NUMA_NODES
    if value is None and stripped not in ("-1", "-01", "-001"):
        assert len(warnings) <= 1
    assert all("/sys/x/numa_node" in w for w in warnings)


def test_a_value_the_model_refuses_costs_that_port_only(
    intel_node: FakeNode, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """Were discovery ever to let an impossible NUMA node through, the model's own check
    must lose that one port, not the whole scan."""
    import plugin.discovery.backends.pcifn as pcifn

    real = pcifn.numa_node

    def leaky(attr: Attr, warnings: list[str]) -> int | None:
        return 10**20 if "0000:d8:00.0" in str(attr.path) else real(attr, warnings)

    monkeypatch.setattr(pcifn, "numa_node", leaky)
    with caplog.at_level(logging.WARNING):
        devices = by_id(IntelBackend(intel_node.config()).scan())
    assert "0000:d8:00.0" not in devices
    assert len(devices) == 5 and all(d.healthy for d in devices.values())
    [port] = intel_node.cards["0000:d8:00.0"].ports
    assert str(intel_node.port_class_path(port)) in caplog.text
