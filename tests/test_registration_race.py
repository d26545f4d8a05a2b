"""A kubelet that is replaced just as its Register call returns."""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from api_versions.negotiate import adapters
from api_versions.retry import RetryPolicy
from compat_tests.kubelet import KubeletEmulator
from plugin.model.feed import DeviceFeed
from plugin.process.dirwatch import Change, DirEvent
from plugin.serving import socket_claim as socket_module
from plugin.serving.deviceplugin import kubelet_socket as negotiation_module
from plugin.serving.deviceplugin.server import ResourceServer
from plugin.serving.deviceplugin.timing import Timing
from value_types.devices import DeviceSet


@pytest.fixture
def directory() -> Iterator[Path]:
    """Short, for unix socket paths."""
    path = Path(tempfile.mkdtemp(prefix="dp", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_a_kubelet_replaced_as_register_returns_is_registered_with_at_once(
    directory: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Seen once in 200 restarts: the new ``kubelet.sock``'s directory event arrived while
    the round was finishing and was spent on it, the registration with the dead kubelet
    was kept, and only the 5 s safety net found the new one. Here no directory events are
    delivered at all (the server runs without its daemon), so only the server's own check
    after Register can find the new kubelet."""
    first = KubeletEmulator(directory, "1.26")
    second = KubeletEmulator(directory, "1.26", wipe_at_start=False)
    real_negotiate = negotiation_module.negotiate
    replaced = False

    async def negotiate_then_the_kubelet_restarts(*args: Any, **kwargs: Any) -> Any:
        nonlocal replaced
        adapter = await real_negotiate(*args, **kwargs)
        if not replaced:
            replaced = True
            await first.crash()
            await second.start()
        return adapter

    monkeypatch.setattr(negotiation_module, "negotiate", negotiate_then_the_kubelet_restarts)
    await first.start()
    server = ResourceServer(
        "b-com.com/accelerator", directory, "a.sock", DeviceFeed(DeviceSet.of(())),
        adapters(), RetryPolicy(attempts=1), Timing(),
    )
    task = asyncio.create_task(server.run())
    try:
        await second.wait_until(lambda: len(second.registrations) == 1, 5.0,
                                "registration with the kubelet that replaced the first")
        assert len(first.registrations) == 1
    finally:
        server.stop()
        await asyncio.wait_for(task, 10)
        await second.stop()
        await first.stop()


async def test_a_socket_wiped_while_it_is_being_confirmed_is_served_anew_at_once(
    directory: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """Seen once in 54 runs of 200 kubelet restarts: a starting kubelet wiped the directory
    just after the plugin's new socket was moved into place. The plugin then waited out its
    2 s confirmation timeout on a socket that no longer existed, and logged an error."""
    kubelet = KubeletEmulator(directory, "1.26")
    await kubelet.start()
    server = ResourceServer(
        "b-com.com/accelerator", directory, "a.sock", DeviceFeed(DeviceSet.of(())),
        adapters(), RetryPolicy(attempts=1), Timing(),
    )
    real_move, real_identity = socket_module.move_into_place, socket_module.identity
    moved = False
    wiped = False

    def move_into_place(staged: Path, final: Path) -> None:
        nonlocal moved
        real_move(staged, final)
        moved = True

    def wipe() -> None:
        """What a kubelet's start-up clean-up and the directory event it causes do."""
        server.socket_path.unlink()
        server.on_dir_event(DirEvent(directory, server.socket_name, Change.DELETED))

    def identity(path: Path) -> Any:
        nonlocal moved, wiped
        found = real_identity(path)
        if moved and not wiped and path == server.socket_path:
            moved, wiped = False, True
            asyncio.get_running_loop().call_soon(wipe)  # once serving is being confirmed
        return found

    monkeypatch.setattr(socket_module, "move_into_place", move_into_place)
    monkeypatch.setattr(socket_module, "identity", identity)
    caplog.set_level(logging.INFO)
    task = asyncio.create_task(server.run())
    try:
        await kubelet.wait_until(lambda: len(kubelet.registrations) == 1, 10.0,
                                 "registration once the wiped socket is served anew")
    finally:
        server.stop()
        await asyncio.wait_for(task, 10)
        await kubelet.stop()
    assert wiped
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors
    assert any("serving anew" in r.getMessage() for r in caplog.records)
