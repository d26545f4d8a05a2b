"""Fake nodes for backend tests, built fresh under each test's temporary directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from compat_tests.fake_sysfs import FakeNode, build_f1_16xlarge, build_intel_node
from value_types.devices import Device


@pytest.fixture
def intel_node(tmp_path: Path) -> FakeNode:
    return build_intel_node(tmp_path)


@pytest.fixture
def f1_node(tmp_path: Path) -> FakeNode:
    return build_f1_16xlarge(tmp_path)


def by_id(devices: list[Device]) -> dict[str, Device]:
    return {d.id: d for d in devices}
