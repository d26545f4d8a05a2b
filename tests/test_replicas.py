"""--replicas: the setting, the IDs the kubelet is shown, and what it gets back for them."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugin.model.allocation import ENV_DEVICES, ENV_REPLICAS, ENV_UNITS
from plugin.model.replica_allocation import (
    allocate_replicas,
    preferred_replicas,
    replicas_preference_matters,
)
from plugin.model.replicas import (
    MAX_REPLICAS,
    ReplicaCount,
    announce,
    device_of,
    parse_replicas,
    replica_id,
    replicas_of,
    replicate,
)
from plugin.serving.deviceplugin.allocator import (
    MODEL_ALLOCATOR,
    ReplicaAllocator,
    allocator_for,
)
from value_types.allocation import AllocationError
from value_types.devices import Device, DeviceNode, DeviceSet, Health, Mount


def port(bdf: str, numa: int | None = None, healthy: bool = True) -> Device:
    return Device(id=bdf, backend="intel", numa_node=numa,
                  health=Health.HEALTHY if healthy else Health.UNHEALTHY,
                  health_reason="" if healthy else "AFU ID is all f",
                  nodes=(DeviceNode(f"/dev/port.{bdf}", f"/dev/port.{bdf}"),),
                  mounts=(Mount("/opt/lib", "/opt/lib"),))


PORTS = DeviceSet.of([port("0000:3b:00.0", 0), port("0000:5e:00.0", 1)])


def test_the_setting_reads_resources_and_a_wildcard():
    setting = parse_replicas(" b-com.com/accelerator=4 , *=2,")
    assert setting == (ReplicaCount("b-com.com/accelerator", 4), ReplicaCount("*", 2))
    assert ",".join(map(str, setting)) == "b-com.com/accelerator=4,*=2"
    assert replicas_of(setting, "b-com.com/accelerator") == 4
    assert replicas_of(setting, "b-com.com/afu-d8424dc4") == 2
    assert replicas_of((), "b-com.com/accelerator") == 1
    assert parse_replicas("") == ()
    assert parse_replicas(f"*={MAX_REPLICAS}") == (ReplicaCount("*", MAX_REPLICAS),)


@pytest.mark.parametrize(("text", "says"), [
    ("b-com.com/accelerator", "is not RESOURCE=N"),
    ("=4", "is not RESOURCE=N"),
    ("a.com/b=4=5", "is not RESOURCE=N"),
    ("b-com.com/accelerator=0", "from 1 to 64"),
    ("b-com.com/accelerator=65", "from 1 to 64"),
    ("b-com.com/accelerator=-1", "from 1 to 64"),
    ("b-com.com/accelerator=4_0", "from 1 to 64"),
    ("b-com.com/accelerator=2.5", "from 1 to 64"),
    ("b-com.com/accelerator=", "from 1 to 64"),
    ("accelerator=4", "exactly one '/'"),
    ("kubernetes.io/fpga=4", "reserved"),
    ("a.com/b=2,a.com/b=3", "gives a.com/b more than once"),
    ("*=2,*=3", r"gives \* more than once"),
])
def test_a_malformed_setting_is_refused_naming_the_entry(text, says):
    with pytest.raises(ValueError, match=says) as refused:
        parse_replicas(text)
    assert "\n" not in str(refused.value)


def test_each_device_is_advertised_count_times_with_its_health_and_topology():
    sick = DeviceSet.of([port("0000:3b:00.0", 0, healthy=False), port("0000:5e:00.0", 1)])
    advertised, left_out = replicate(sick, 3)
    assert left_out == []
    assert advertised.ids == ("0000:3b:00.0::0", "0000:3b:00.0::1", "0000:3b:00.0::2",
                              "0000:5e:00.0::0", "0000:5e:00.0::1", "0000:5e:00.0::2")
    first = [d for d in advertised if d.id.startswith("0000:3b")]
    assert all(not d.healthy and d.health_reason == "AFU ID is all f" and d.numa_node == 0
               for d in first)
    assert all(d.healthy and d.numa_node == 1 for d in advertised if d not in first)
    assert replicate(sick, 1) == (sick, [])


def test_ids_map_back_only_when_spelled_as_advertised():
    assert device_of(replica_id("0000:3b:00.0", 12)) == ("0000:3b:00.0", 12)
    assert device_of("7::0") == ("7", 0)
    for forged in ("0000:3b:00.0", "a::01", "a::+1", "a:: 1", "::1", "a::", "a::1000"):
        assert device_of(forged) is None, forged


def test_a_device_whose_id_holds_the_separator_is_left_out_and_said_once(caplog):
    devices = DeviceSet.of([port("0000:3b:00.0"), port("odd::1")])
    advertised, left_out = replicate(devices, 2)
    assert left_out == ["odd::1"]
    assert advertised.ids == ("0000:3b:00.0::0", "0000:3b:00.0::1")
    allocator = ReplicaAllocator("b-com.com/accelerator", 2)
    with caplog.at_level(logging.ERROR):
        assert allocator.advertised(devices) == advertised
        assert allocator.advertised(DeviceSet.of(list(devices))) == advertised
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "odd::1 is not advertised" in said[0], said


def test_two_replicas_of_one_device_give_its_nodes_once_and_both_indexes():
    advertised, _ = replicate(PORTS, 3)
    granted = allocate_replicas(PORTS, advertised, ["0000:3b:00.0::2", "0000:3b:00.0::0"])
    assert granted.device_ids == ("0000:3b:00.0",)
    assert granted.nodes == PORTS.get("0000:3b:00.0").nodes
    assert granted.mounts == (Mount("/opt/lib", "/opt/lib"),)
    assert granted.envs == {ENV_UNITS: "0000:3b:00.0,0000:3b:00.0",
                            ENV_DEVICES: "0000:3b:00.0,0000:3b:00.0", ENV_REPLICAS: "2,0"}
    spread = allocate_replicas(PORTS, advertised, ["0000:5e:00.0::1", "0000:3b:00.0::1"])
    assert spread.device_ids == ("0000:5e:00.0", "0000:3b:00.0")
    assert spread.envs[ENV_REPLICAS] == "1,1"
    assert len(spread.nodes) == 2


@pytest.mark.parametrize(("requested", "says"), [
    (["0000:3b:00.0::3"], "unknown device IDs: 0000:3b:00.0::3 (this plugin owns "
                          "0000:3b:00.0::0, 0000:3b:00.0::1, 0000:3b:00.0::2"),
    (["0000:99:00.0::0"], "unknown device IDs: 0000:99:00.0::0"),
    (["0000:3b:00.0"], "unknown device IDs: 0000:3b:00.0 "),
    (["0000:3b:00.0::01"], "unknown device IDs: 0000:3b:00.0::01"),
    (["0000:3b:00.0::1", "0000:3b:00.0::1"], "requested more than once: 0000:3b:00.0::1"),
    ([], "no device IDs requested"),
])
def test_a_replica_the_plugin_did_not_advertise_is_refused_as_any_unknown_id(requested, says):
    advertised, _ = replicate(PORTS, 3)
    with pytest.raises(AllocationError, match=None) as refused:
        allocate_replicas(PORTS, advertised, requested)
    assert says in str(refused.value), refused.value


def test_a_replica_of_an_unhealthy_device_is_refused():
    sick = DeviceSet.of([port("0000:3b:00.0", healthy=False)])
    advertised, _ = replicate(sick, 2)
    with pytest.raises(AllocationError, match=r"unhealthy device IDs: 0000:3b:00.0::1 "
                                              r"\(AFU ID is all f\)"):
        allocate_replicas(sick, advertised, ["0000:3b:00.0::1"])


def test_preferred_replicas_spread_over_the_least_used_devices():
    devices = DeviceSet.of([port("a", 0), port("b", 0), port("c", 1)])
    advertised, _ = replicate(devices, 4)
    every = list(advertised.ids)
    # Nothing taken yet: one replica of each device before a second of any.
    assert preferred_replicas(advertised, 4, every, [], 4) == ["a::0", "b::0", "c::0", "a::1"]
    # a has three replicas in use elsewhere, b one: c first; then b and c have one taken
    # each, and c's NUMA node, which the request now uses, decides; then b.
    available = [i for i in every if i not in ("a::0", "a::1", "a::2", "b::0")]
    assert preferred_replicas(advertised, 4, available, [], 3) == ["c::0", "c::1", "b::1"]
    assert preferred_replicas(advertised, 4, available, [], 5) == [
        "c::0", "c::1", "b::1", "b::2", "c::2"]
    # What must be included counts as taken, and its NUMA node breaks ties.
    assert preferred_replicas(advertised, 4, every, ["c::3"], 2) == ["c::3", "a::0"]
    assert preferred_replicas(advertised, 4, every, ["c::3"], 3) == ["c::3", "a::0", "b::0"]
    ties = DeviceSet.of([port("a", 0), port("b", 1), port("c", 1)])
    tied, _ = replicate(ties, 2)
    assert preferred_replicas(tied, 2, list(tied.ids), ["b::0"], 2) == ["b::0", "c::0"]


def test_preferred_replicas_never_propose_what_cannot_be_granted():
    devices = DeviceSet.of([port("a"), port("b", healthy=False)])
    advertised, _ = replicate(devices, 2)
    assert preferred_replicas(advertised, 2, ["b::0", "a::0", "x::0", "a"], ["b::1"], 5) \
        == ["a::0"]
    assert preferred_replicas(advertised, 2, list(advertised.ids), [], 0) == []
    assert preferred_replicas(advertised, 2, list(advertised.ids), ["a::1", "a::0"], 1) \
        == ["a::1"]


def test_spreading_is_worth_a_call_only_with_two_devices_or_more():
    assert replicas_preference_matters(DeviceSet.of([port("a", 0), port("b", 0)]))
    assert not replicas_preference_matters(DeviceSet.of([port("a", 0)]))
    assert not MODEL_ALLOCATOR.preference_matters(DeviceSet.of([port("a", 0), port("b", 0)]))
    assert allocator_for("x.com/y", 2).preference_matters(
        DeviceSet.of([port("a", 0), port("b", 0)]))


def test_one_replica_is_the_plain_device_plugin():
    assert allocator_for("x.com/y", 1) is MODEL_ALLOCATOR
    assert MODEL_ALLOCATOR.advertised(PORTS) is PORTS


def test_the_start_line_names_what_single_mode_advertises(caplog):
    with caplog.at_level(logging.INFO):
        announce(parse_replicas("other.com/fpga=4,*=2"), "single", "b-com.com/accelerator")
        announce((), "single", "b-com.com/accelerator")
    said = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert said == [
        (logging.WARNING, "--replicas names other.com/fpga, which this plugin never "
                          "advertises: it advertises only b-com.com/accelerator "
                          "(--resource-mode single); those entries have no effect"),
        (logging.INFO, "--replicas: each device of b-com.com/accelerator is advertised 2 "
                       "time(s)")]
    caplog.clear()
    with caplog.at_level(logging.INFO):
        announce(parse_replicas("b-com.com/afu-x=3"), "afu", "b-com.com/accelerator")
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert "afu mode" in caplog.records[0].getMessage()
    caplog.clear()
    with caplog.at_level(logging.INFO):
        announce(parse_replicas("*=3"), "single", "b-com.com/accelerator", "dra")
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "--replicas has no effect with --api dra: it applies to the device "
                          "plugin only (DRA shares devices through --dra-share)")]


@settings(max_examples=200, deadline=None)
@given(count=st.integers(2, 5), healthy=st.lists(st.booleans(), min_size=1, max_size=4),
       available=st.lists(st.sampled_from(["a::0", "a::1", "b::2", "c::0", "c::4", "d::1",
                                           "a::9", "b", "x::0", "a::01"]), max_size=12),
       must=st.lists(st.sampled_from(["a::0", "b::1", "x::0", "c::3"]), max_size=3),
       size=st.integers(-1, 12))
def test_preferred_replicas_are_always_grantable(count, healthy, available, must, size):
    devices = DeviceSet.of(port(name, numa=i % 2, healthy=ok)
                           for i, (name, ok) in enumerate(zip("abcd", healthy, strict=False)))
    advertised, _ = replicate(devices, count)
    chosen = preferred_replicas(advertised, count, available, must, size)
    assert len(chosen) == len(set(chosen)) <= max(size, 0)
    usable = {i for i in available if (d := advertised.get(i)) is not None and d.healthy}
    assert set(chosen) <= usable
    assert len(chosen) == min(max(size, 0), len(usable))
    if chosen:
        allocate_replicas(devices, advertised, chosen)  # never refused
