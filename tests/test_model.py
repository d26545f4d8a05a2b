"""The internal model: snapshots compare as values and sort IDs the way people read them."""

from __future__ import annotations

import pytest

from value_types.devices import Device, DeviceSet, Health


def test_device_set_orders_numeric_ids_numerically_and_diffs() -> None:
    old = DeviceSet.of(Device(id=str(i), backend="units") for i in (10, 2, 1))
    assert old.ids == ("1", "2", "10")
    new = DeviceSet.of([Device(id="1", backend="units"),
                        Device(id="2", backend="units", health=Health.UNHEALTHY),
                        Device(id="3", backend="units")])
    diff = old.diff(new)
    assert (diff.added, diff.removed, diff.changed) == (("3",), ("10",), ("2",))
    assert old != new and old == DeviceSet.of(reversed(list(old)))


def test_duplicate_ids_and_bad_values_are_refused() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        DeviceSet.of([Device(id="1", backend="x"), Device(id="1", backend="x")])
    with pytest.raises(ValueError, match="NUMA"):
        Device(id="a", backend="x", numa_node=-1)
    with pytest.raises(ValueError, match="non-empty"):
        Device(id="", backend="x")


def test_attributes_are_order_independent() -> None:
    a = Device(id="a", backend="x", attributes=(("k", "1"), ("j", "2")))
    b = Device(id="a", backend="x", attributes=(("j", "2"), ("k", "1")))
    assert a == b and hash(a) == hash(b) and a.attribute("k") == "1"


def test_numa_nodes_beyond_what_linux_allows_and_unknown_health_are_refused() -> None:
    assert Device(id="a", backend="x", numa_node=1023).numa_node == 1023
    for impossible in (1024, 10**20):
        with pytest.raises(ValueError, match="NUMA"):
            Device(id="a", backend="x", numa_node=impossible)
    assert Device(id="a", backend="x", health="Unhealthy").health is Health.UNHEALTHY  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Device(id="a", backend="x", health="Broken")  # type: ignore[arg-type]
