"""The ``device`` variable and CEL semantics of compat_tests/cel_devices.py, as Kubernetes's
DRA CEL environment has them (qualified names, empty unknown domains, errors on missing
attributes, heterogeneous equality, semantic versions and quantities)."""

from __future__ import annotations

import pytest

from compat_tests import cel_devices
from compat_tests.apiserver import objects
from plugin.cli import config

DRIVER = config.DEFAULT_DRA_DRIVER


def test_unqualified_names_are_the_drivers_and_unknown_domains_are_empty():
    device = objects.device("d", {"family": "intel", "resource.kubernetes.io/pciBusID":
                                  "0000:5e:00.0", "slot": 3, "programmable": True})
    assert cel_devices.evaluate(f'device.attributes["{DRIVER}"].family == "intel"', device,
                                DRIVER)
    assert cel_devices.evaluate('device.attributes["resource.kubernetes.io"].pciBusID == '
                                '"0000:5e:00.0"', device, DRIVER)
    assert cel_devices.evaluate(f'device.attributes["{DRIVER}"].slot == 3', device, DRIVER)
    assert cel_devices.evaluate(f'device.driver == "{DRIVER}"', device, DRIVER)
    assert cel_devices.evaluate('device.attributes["other.example.com"] == {}', device, DRIVER)
    assert not cel_devices.evaluate('"x" in device.attributes["other.example.com"]', device,
                                    DRIVER)
    with pytest.raises(cel_devices.CelRuntimeError, match="not a bool"):
        cel_devices.evaluate(f'device.attributes["{DRIVER}"].slot', device, DRIVER)


def test_versions_and_quantities_compare_by_value():
    device = objects.device("d", {"firmware": {"version": "1.10.0-rc.1"}},
                            capacity={"memory": "1Gi"})
    def holds(expression: str) -> bool:
        return cel_devices.evaluate(expression, device, DRIVER)

    firmware = f'device.attributes["{DRIVER}"].firmware'
    assert holds(f'{firmware}.isGreaterThan(semver("1.9.0"))')
    assert holds(f'{firmware}.isLessThan(semver("1.10.0"))')  # a pre-release sorts before
    assert holds(f'{firmware}.major() == 1 && {firmware}.minor() == 10')
    assert not holds(f'{firmware} == "1.10.0-rc.1"')  # a version is no string
    assert holds(f'device.capacity["{DRIVER}"].memory == quantity("1024Mi")')
    assert holds(f'device.capacity["{DRIVER}"].memory.compareTo(quantity("2Gi")) < 0')
    with pytest.raises(cel_devices.CelCompileError):
        cel_devices.evaluate("device.driver ==", device, DRIVER)


def test_attribute_values_reach_cel_with_their_kind():
    """A published int stays an int, as the slice spells it, not a string."""
    device = objects.device("d", {"slot": {"int": 3}})
    assert cel_devices.evaluate(f'device.attributes["{DRIVER}"].slot == 3', device, DRIVER)
    # Another type is unequal, not an error (cel-go's heterogeneous equality).
    assert not cel_devices.evaluate(f'device.attributes["{DRIVER}"].slot == "3"', device,
                                    DRIVER)
    assert not cel_devices.evaluate(f'"3" == device.attributes["{DRIVER}"].slot', device,
                                    DRIVER)


def test_logical_operators_absorb_errors_as_cel_does():
    """CEL's && and || are commutative over errors: a false (or true) side decides whatever
    the other gives; only when nothing decides does the error surface. The example classes'
    guards rely on it."""
    device = objects.device("d", {"family": "alveo"})
    missing = f'device.attributes["{DRIVER}"].afuID == "x"'

    def holds(expression: str) -> bool:
        return cel_devices.evaluate(expression, device, DRIVER)

    assert holds(f"{missing} && false") is False
    assert holds(f"false && {missing}") is False
    assert holds(f"{missing} || true") is True
    assert holds(f'"afuID" in device.attributes["{DRIVER}"] && {missing}') is False
    with pytest.raises(cel_devices.CelRuntimeError, match="afuID"):
        holds(f"{missing} || false")
    with pytest.raises(cel_devices.CelRuntimeError, match="afuID"):
        holds(f"true && {missing}")


def test_selectors_stop_at_the_first_that_does_not_match():
    """The allocator tries a class's selectors in order and stops at a false one, so a
    later selector's lookup never runs on a device an earlier one turned away."""
    device = objects.device("d", {"family": "alveo"})
    selectors = [{"cel": {"expression": f'device.attributes["{DRIVER}"].family == "intel"'}},
                 {"cel": {"expression": f'device.attributes["{DRIVER}"].afuID == "x"'}}]
    assert cel_devices.selectors_match(selectors, device, DRIVER) is False
    with pytest.raises(cel_devices.CelRuntimeError):
        cel_devices.selectors_match(selectors[1:], device, DRIVER)
