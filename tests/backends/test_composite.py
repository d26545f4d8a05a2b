"""A composite backend offers every ability of its parts, whatever abilities there are."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from compat_tests.fake_sysfs import FakeNode
from plugin.discovery.backends import BACKEND_NAMES, BackendConfig, make_backend
from plugin.discovery.backends.auto import AutoBackend, CompositeBackend
from plugin.discovery.backends.base import ABILITIES, Backend


def protocol_members() -> set[str]:
    annotated = set(inspect.get_annotations(Backend))
    methods = {n for n, v in vars(Backend).items()
               if inspect.isfunction(v) and not n.startswith("_")}
    return (annotated | methods) - {"name", "static", "scan"}


def ability(backend: object, name: str) -> tuple[object, ...]:
    value = getattr(backend, name)
    return tuple(value() if callable(value) else value)


def test_abilities_list_every_member_of_the_backend_protocol() -> None:
    # A new ability added to the protocol must be added to ABILITIES, so the test below
    # holds every composite to it.
    assert set(ABILITIES) == protocol_members()


@pytest.mark.parametrize("name", BACKEND_NAMES)
def test_every_backend_offers_every_ability(tmp_path: Path, name: str) -> None:
    node = FakeNode(tmp_path)
    backend = make_backend(name, node.config())
    backend.scan()
    for member in ABILITIES:
        assert isinstance(ability(backend, member), tuple), member


def test_auto_offers_the_union_of_its_parts_abilities(tmp_path: Path) -> None:
    node = FakeNode(tmp_path)
    node.add_dfl_card("0000:3b:00.0")
    node.add_opae_card("0000:5e:00.0")
    node.add_slot("0000:00:1b.0")
    auto = make_backend("auto", node.config())
    assert isinstance(auto, AutoBackend)
    auto.scan()
    for part in auto.parts:
        part.scan()
    for member in ABILITIES:
        combined = ability(auto, member)
        expected = tuple(dict.fromkeys(x for part in auto.parts for x in ability(part, member)))
        assert combined == expected, member
    assert ability(auto, "health_files"), "the Intel part's health files must reach the monitor"


def test_auto_serves_every_family_on_a_mixed_node(tmp_path: Path) -> None:
    node = FakeNode(tmp_path)
    node.add_dfl_card("0000:3b:00.0")
    node.add_slot("0000:00:1b.0")
    devices = make_backend("auto", node.config()).scan()
    assert {d.backend for d in devices} == {"intel", "aws"}


def test_a_composite_is_static_only_when_every_part_is() -> None:
    config = BackendConfig(nb_units=3)
    units, none = make_backend("units", config), make_backend("none", config)
    static = CompositeBackend("both", [units, none], "nothing")
    assert static.static and [d.id for d in static.scan()] == ["0", "1", "2"]
    assert not CompositeBackend("mixed", [units, make_backend("aws", config)], "x").static
