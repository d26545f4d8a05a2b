"""Negotiation against scripted kubelets: what moves on, what is retried, what is refused."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest

from api_versions.negotiate import (
    KubeletUnreachable,
    NoGenerationAccepted,
    RegistrationRefused,
    Withdrawn,
    adapters,
    negotiate,
)
from api_versions.retry import RetryPolicy
from api_versions.wire import WireApi, rpc_handler
from plugin.model.feed import DeviceFeed
from plugin.serving.deviceplugin.allocator import MODEL_ALLOCATOR
from value_types.devices import Device, DeviceSet

FAST = RetryPolicy(attempts=4, initial_backoff=0.01, max_backoff=0.02, jitter=0.0,
                   register_timeout=2.0)
Script = Callable[[object], tuple[grpc.StatusCode, str] | None]


class Resource:
    """The served resource negotiation registers: a name, its device feed, its rules."""

    resource_name = "b-com.com/accelerator"

    allocator = MODEL_ALLOCATOR

    def __init__(self, *devices: Device) -> None:
        self.feed = DeviceFeed(DeviceSet.of(devices))


RESOURCE = Resource(Device(id="0000:5e:00.0", backend="intel", numa_node=0),
                    Device(id="0000:d8:00.0", backend="intel", numa_node=1))


@pytest.fixture
async def directory() -> AsyncIterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dpn", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def scripted_kubelet(directory: Path, generation: str, script: Script) -> grpc.aio.Server:
    """Serves one generation's Registration; ``script(request)`` returns an error or None."""
    wire = WireApi.load(generation)
    calls: list[object] = []

    async def register(request, context):
        calls.append(request)
        failure = script(request)
        if failure is not None:
            await context.abort(*failure)
        return wire.new("Empty")

    server = grpc.aio.server()
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        f"{wire.package}.Registration",
        {"Register": rpc_handler(wire.method("Registration", "Register"), register)},
    )])
    server.add_insecure_port(f"unix://{directory / 'kubelet.sock'}")
    await server.start()
    server.calls = calls  # type: ignore[attr-defined]
    return server


def test_default_order_is_newest_first_by_pep440() -> None:
    assert [a.name for a in adapters()] == ["v1beta1", "v1alpha2", "v1alpha1"]
    assert [a.name for a in adapters(["v1alpha1", "v1beta1"])] == ["v1alpha1", "v1beta1"]
    with pytest.raises(ValueError, match="v2"):
        adapters(["v2"])


async def test_unimplemented_and_version_refusal_move_on_at_once(directory: Path) -> None:
    """A 1.8 kubelet: v1beta1 is another package (UNIMPLEMENTED), v1alpha2 has the wrong
    version string; both are passed over without a retry and v1alpha1 registers."""
    refusal = (grpc.StatusCode.UNKNOWN, "Unsupported API version by the Kubelet registry")
    kubelet = await scripted_kubelet(
        directory, "v1alpha1", lambda r: None if r.version == "0.1" else refusal
    )
    offered: list[str] = []
    try:
        chosen = await negotiate(directory, adapters(), RESOURCE, "a.sock", FAST,
                                 before_attempt=lambda a: offered.append(a.name))
    finally:
        await kubelet.stop(0)
    assert chosen.name == "v1alpha1"
    assert offered == ["v1beta1", "v1alpha2", "v1alpha1"]
    assert [r.version for r in kubelet.calls] == ["v1alpha2", "0.1"]
    assert kubelet.calls[-1].endpoint == "a.sock"
    assert kubelet.calls[-1].resource_name == "b-com.com/accelerator"


async def test_transient_failures_are_retried_on_the_same_generation(directory: Path) -> None:
    answers = iter([(grpc.StatusCode.UNAVAILABLE, "busy"), (grpc.StatusCode.UNAVAILABLE, "busy"),
                    None])
    kubelet = await scripted_kubelet(directory, "v1beta1", lambda _r: next(answers))
    try:
        chosen = await negotiate(directory, adapters(), RESOURCE, "a.sock", FAST)
    finally:
        await kubelet.stop(0)
    assert chosen.name == "v1beta1"
    assert len(kubelet.calls) == 3
    assert kubelet.calls[0].options.get_preferred_allocation_available


async def test_absent_kubelet_is_unreachable_without_trying_other_generations(
    directory: Path,
) -> None:
    offered: list[str] = []
    with pytest.raises(KubeletUnreachable, match="4 tries of v1beta1"):
        await negotiate(directory, adapters(), RESOURCE, "a.sock", FAST,
                        before_attempt=lambda a: offered.append(a.name))
    assert offered == ["v1beta1"]


async def test_kubelet_accepting_nothing_names_every_generation(directory: Path) -> None:
    kubelet = await scripted_kubelet(
        directory, "v1beta1",
        lambda r: (grpc.StatusCode.UNKNOWN,
                   f'requested API version "{r.version}" is not supported by kubelet. '
                   'Supported version is ["v2"]'),
    )
    try:
        with pytest.raises(NoGenerationAccepted) as failure:
            await negotiate(directory, adapters(), RESOURCE, "a.sock", FAST)
    finally:
        await kubelet.stop(0)
    assert [name for name, _ in failure.value.tried] == ["v1beta1", "v1alpha2", "v1alpha1"]
    assert "not supported by kubelet" in str(failure.value)


async def test_other_errors_are_a_refusal_not_a_version_problem(directory: Path) -> None:
    kubelet = await scripted_kubelet(
        directory, "v1beta1", lambda _r: (grpc.StatusCode.UNKNOWN, "invalid resource name"),
    )
    try:
        with pytest.raises(RegistrationRefused, match="invalid resource name"):
            await negotiate(directory, adapters(), RESOURCE, "a.sock", FAST)
    finally:
        await kubelet.stop(0)
    assert len(kubelet.calls) == 1


async def test_hanging_kubelet_hits_the_deadline_and_is_retried(directory: Path) -> None:
    import asyncio

    wire = WireApi.load("v1beta1")
    calls = 0

    async def hang(_request, _context):
        nonlocal calls
        calls += 1
        await asyncio.sleep(30)
        return wire.new("Empty")

    server = grpc.aio.server()
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "v1beta1.Registration",
        {"Register": rpc_handler(wire.method("Registration", "Register"), hang)})])
    server.add_insecure_port(f"unix://{directory / 'kubelet.sock'}")
    await server.start()
    policy = RetryPolicy(attempts=2, initial_backoff=0.01, max_backoff=0.01, jitter=0.0,
                         register_timeout=0.2)
    try:
        with pytest.raises(KubeletUnreachable, match="DEADLINE_EXCEEDED"):
            await negotiate(directory, adapters(), RESOURCE, "a.sock", policy)
    finally:
        await server.stop(0)
    assert calls == 2


def test_preferred_allocation_is_advertised_only_where_topology_can_change_the_choice() -> None:
    v1beta1 = next(a for a in adapters() if a.name == "v1beta1")
    units = Resource(*(Device(id=str(i), backend="units") for i in range(4)))
    assert not v1beta1.register_request(units, "a.sock").options \
        .get_preferred_allocation_available
    one_node = Resource(*(Device(id=f"0000:{b}:00.0", backend="intel", numa_node=1)
                          for b in ("5e", "d8")))
    assert not v1beta1.register_request(one_node, "a.sock").options \
        .get_preferred_allocation_available, "one NUMA node: nothing to pack"
    two_nodes = Resource(Device(id="0000:5e:00.0", backend="intel", numa_node=0),
                         Device(id="0000:d8:00.0", backend="intel", numa_node=1))
    assert v1beta1.register_request(two_nodes, "a.sock").options \
        .get_preferred_allocation_available
    assert v1beta1.registration_terms(units) != v1beta1.registration_terms(two_nodes)
    older = [a for a in adapters() if a.name != "v1beta1"]
    assert all(a.registration_terms(units) is None for a in older)


async def test_a_registration_answered_after_stopping_began_is_not_held(directory, caplog):
    """The kubelet answers a Register sent just before the plugin began stopping: the round
    ends Withdrawn, and nothing says the resource is registered."""
    stopping = False

    def answer_as_the_plugin_stops(_request):
        nonlocal stopping
        stopping = True
        return None

    kubelet = await scripted_kubelet(directory, "v1beta1", answer_as_the_plugin_stops)
    try:
        with caplog.at_level("INFO", logger="api_versions"), pytest.raises(Withdrawn):
            await negotiate(directory, adapters(["v1beta1", "v1alpha2"]), RESOURCE,
                            "plugin.sock", FAST, wanted=lambda: not stopping)
    finally:
        await kubelet.stop(None)
    assert len(kubelet.calls) == 1, "no further generation is offered once stopping"
    assert not [r for r in caplog.records if "registered" in r.getMessage()]


async def test_nothing_is_offered_once_stopping_began(directory):
    kubelet = await scripted_kubelet(directory, "v1beta1", lambda _request: None)
    try:
        with pytest.raises(Withdrawn, match="about to be offered"):
            await negotiate(directory, adapters(["v1beta1"]), RESOURCE, "plugin.sock", FAST,
                            wanted=lambda: False)
    finally:
        await kubelet.stop(None)
    assert kubelet.calls == []
