"""No device value, however wrong, fails ListAndWatch for the other devices of its resource.

The kubelet drops a resource whose stream fails, healthy devices included. These tests push
arbitrary devices (values the model would refuse included, set behind its back) and
arbitrary sysfs ``numa_node`` contents through the ListAndWatch handler of every generation
exactly as gRPC calls it, serialise each answer with the handler's own serialiser and decode
it as the kubelet would.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from collections.abc import AsyncIterator, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api_versions.adapter import Adapter
from api_versions.negotiate import adapters
from api_versions.wire_values import MAX_ID_BYTES, id_problem
from compat_tests.fake_sysfs import FakeNode, build_intel_node
from plugin.discovery.backends.intel import IntelBackend
from plugin.serving.deviceplugin.allocator import MODEL_ALLOCATOR
from value_types.devices import MAX_NUMA_NODES, Device, Health

ADAPTERS = adapters()
GENERATIONS = [a.name for a in ADAPTERS]


class StubFeed:
    """Just enough of a DeviceFeed for ListAndWatch: one snapshot, then the stream ends."""

    def __init__(self, devices: Iterable[Device]) -> None:
        self.devices = list(devices)

    async def subscribe(self) -> AsyncIterator[list[Device]]:
        yield self.devices


class StubResource:
    def __init__(self, devices: Iterable[Device]) -> None:
        self.resource_name = "b-com.com/accelerator"
        self.feed = StubFeed(devices)
        self.allocator = MODEL_ALLOCATOR  # every device under its own ID


class NoAbort:
    async def abort(self, code: Any, details: str) -> None:
        raise AssertionError(f"ListAndWatch failed the stream: {code} {details}")


def sent(adapter: Adapter, devices: Iterable[Device]) -> list[Any]:
    """The devices the kubelet decodes from the first ListAndWatch message."""
    method = adapter.wire.method("DevicePlugin", "ListAndWatch")
    handler = adapter.handlers(StubResource(devices))[method.path]

    async def first() -> bytes:
        stream = handler.unary_stream(adapter.wire.new("Empty"), NoAbort())
        message = await anext(stream)
        await stream.aclose()
        return handler.response_serializer(message)

    return list(method.response.FromString(asyncio.run(first())).devices)


def hostile(device: Device, **values: object) -> Device:
    """``device`` with values the model refuses, as a bug elsewhere could leave them."""
    for name, value in values.items():
        object.__setattr__(device, name, value)
    return device


def numa_sendable(adapter: Adapter, numa: object) -> bool:
    return adapter.name != "v1beta1" or numa is None or (
        type(numa) is int and 0 <= numa < MAX_NUMA_NODES)


good_ids = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1,
                   max_size=40)
bad_ids = st.one_of(
    st.text(st.characters(blacklist_categories=()), min_size=1, max_size=20),  # surrogates too
    st.integers(MAX_ID_BYTES - 2, 5000).map(lambda n: "x" * n),
    st.sampled_from(["", "\udcff", "a\ud800b", "é" * (MAX_ID_BYTES // 2 + 1)]),
    st.none(), st.integers(), st.binary(max_size=8),
)
numas = st.one_of(st.none(), st.integers(0, MAX_NUMA_NODES - 1), st.integers(),
                  st.sampled_from([10**20, -(10**20), 2**63, 2**63 - 1, -1, True, 1.5, "0"]))
healths = st.one_of(st.sampled_from(list(Health)),
                    st.sampled_from(["Healthy", "Unhealthy", "", "Unknown"]))


@st.composite
def device_lists(draw: st.DrawFn) -> list[Device]:
    devices = []
    for index in range(draw(st.integers(0, 8))):
        device_id = draw(st.one_of(good_ids, bad_ids))
        device = Device(id=f"placeholder{index}", backend="fuzz")
        devices.append(hostile(device, id=device_id, numa_node=draw(numas),
                               health=draw(healths)))
    # A resource never holds two devices with one ID (DeviceSet refuses it).
    unique: dict[str, Device] = {}
    for device in devices:
        unique.setdefault(repr(device.id), device)
    return list(unique.values())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(devices=device_lists(), index=st.integers(0, len(ADAPTERS) - 1))
def test_any_device_values_reach_the_kubelet_without_failing_the_stream(
    devices: list[Device], index: int,
) -> None:
    adapter = ADAPTERS[index]
    wire = sent(adapter, devices)

    expected = [d for d in devices if not id_problem(d.id)]
    assert [w.ID for w in wire] == [d.id for d in expected], "a sendable ID went missing"
    for device, message in zip(expected, wire, strict=True):
        assert message.health in ("Healthy", "Unhealthy")
        faithful = device.health is Health.HEALTHY and numa_sendable(adapter, device.numa_node)
        assert (message.health == "Healthy") == faithful, (device, message)
        if adapter.name == "v1beta1":
            numa = device.numa_node if numa_sendable(adapter, device.numa_node) else None
            shown = [n.ID for n in message.topology.nodes]
            assert shown == ([numa] if numa is not None else []), (device, message)


@pytest.mark.parametrize("generation", GENERATIONS)
def test_an_int64_overflowing_numa_node_costs_that_device_only(generation: str) -> None:
    adapter = next(a for a in ADAPTERS if a.name == generation)
    good = [Device(id=f"0000:5e:00.{i}", backend="intel", numa_node=i % 2) for i in range(3)]
    bad = hostile(Device(id="0000:d8:00.0", backend="intel"), numa_node=10**20)
    wire = {m.ID: m for m in sent(adapter, [*good, bad])}
    assert set(wire) == {d.id for d in good} | {bad.id}
    assert all(wire[d.id].health == "Healthy" for d in good)
    if generation == "v1beta1":
        assert [n.ID for n in wire["0000:5e:00.1"].topology.nodes] == [1]
        assert wire[bad.id].health == "Unhealthy" and not wire[bad.id].HasField("topology")


def test_a_device_that_cannot_be_sent_is_reported_once_not_on_every_send(
    caplog: pytest.LogCaptureFixture,
) -> None:
    adapter = adapters(["v1beta1"])[0]
    devices = [Device(id="0000:5e:00.0", backend="intel"),
               hostile(Device(id="0000:d8:00.0", backend="intel"), numa_node=10**20),
               hostile(Device(id="x", backend="intel"), id="bad\udcff")]
    with caplog.at_level(logging.WARNING, logger="api_versions"):
        for _ in range(5):
            sent(adapter, devices)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    assert any("0000:d8:00.0" in w and "Unhealthy" in w for w in warnings)
    assert any("bad\\udcff" in w and "leaving the device out" in w for w in warnings)


@pytest.fixture(scope="module")
def node() -> Iterator[FakeNode]:
    with tempfile.TemporaryDirectory() as tmp:
        yield build_intel_node(Path(tmp))


numa_texts = st.one_of(st.integers().map(str), st.text(max_size=30),
                       st.from_regex(r"\A[-+]?[0-9]{1,40}\Z"),
                       st.sampled_from(["99999999999999999999", "1024", "-2", "0x1", "1_0"]))


@settings(max_examples=100, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(text=numa_texts)
def test_any_numa_node_file_keeps_every_port_on_every_generation(
    node: FakeNode, text: str,
) -> None:
    numa = node.function_path("0000:d8:00.0") / "numa_node"
    numa.write_bytes(text.encode("utf-8", "surrogateescape"))
    devices = IntelBackend(node.config()).scan()
    assert len(devices) == 6
    for adapter in ADAPTERS:
        wire = {m.ID: m for m in sent(adapter, devices)}
        assert set(wire) == {d.id for d in devices}
        assert all(m.health == "Healthy" for m in wire.values()), adapter.name
        if adapter.name == "v1beta1":
            assert all(n.ID in range(MAX_NUMA_NODES)
                       for m in wire.values() for n in m.topology.nodes)
