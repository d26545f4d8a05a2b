"""Kernel uevents as rescan reasons: decoding, filtering, and life without netlink."""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path

import pytest

from plugin.discovery import uevents
from plugin.discovery.monitor import LISTENING
from plugin.discovery.uevents import events_from, kernel_uevents, parse_uevent

PATIENCE = 30.0


def datagram(action: str, devpath: str, subsystem: str, **extra: str) -> bytes:
    fields = [f"{action}@{devpath}", f"ACTION={action}", f"DEVPATH={devpath}",
              f"SUBSYSTEM={subsystem}", "SEQNUM=4242", *(f"{k}={v}" for k, v in extra.items())]
    return "\0".join(fields).encode() + b"\0"


def test_kernel_datagram_is_decoded() -> None:
    event = parse_uevent(datagram("add", "/devices/pci0000:5e/0000:5e:00.0", "pci",
                                  PCI_ID="8086:09C4"))
    assert event is not None
    assert (event.action, event.subsystem) == ("add", "pci")
    assert event.properties["PCI_ID"] == "8086:09C4"
    assert event.describe() == "add pci 0000:5e:00.0"


def test_header_alone_is_not_enough_without_a_subsystem() -> None:
    assert parse_uevent(b"add@/devices/foo\0") is None


def test_udev_rebroadcasts_and_garbage_are_ignored() -> None:
    assert parse_uevent(b"libudev\0\xfe\xed\xca\xfe" + b"\0" * 30) is None
    assert parse_uevent(b"") is None
    assert parse_uevent(b"\xff\xfe\x00junk") is None
    assert parse_uevent(b"no at sign\0SUBSYSTEM=pci\0") is None


async def test_only_the_wanted_subsystems_come_through() -> None:
    reader, writer = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        for data in (
            datagram("add", "/devices/pci0000:00/0000:00:14.0/usb1/1-1", "usb"),
            b"garbage",
            datagram("remove", "/devices/pci0000:5e/0000:5e:00.0/fpga_region/region0/dfl-port.0",
                     "platform"),
            datagram("add", "/devices/pci0000:00/0000:00:1b.0", "pci"),
        ):
            writer.send(data)
        stream = events_from(reader, {"pci", "platform"})
        first = await asyncio.wait_for(anext(stream), PATIENCE)
        second = await asyncio.wait_for(anext(stream), PATIENCE)
        await stream.aclose()
    finally:
        reader.close()
        writer.close()
    assert [first, second] == ["remove platform dfl-port.0", "add pci 0000:00:1b.0"]


async def test_events_not_sent_by_the_kernel_are_dropped() -> None:
    reader, writer = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        writer.send(datagram("add", "/devices/pci0000:00/0000:00:1b.0", "pci"))
        stream = events_from(reader, {"pci"}, from_kernel_only=True)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(anext(stream), 0.3)
        await stream.aclose()
    finally:
        reader.close()
        writer.close()


async def test_without_netlink_the_source_warns_once_and_stays_silent(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """Ending would get the source restarted, and the warning repeated, for ever; and it
    never says LISTENING, so the monitor keeps rescanning at its short interval."""
    def refuse(*args: object, **kwargs: object) -> socket.socket:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(uevents.socket, "socket", refuse)
    received: list[str] = []

    async def collect() -> None:
        async for event in kernel_uevents({"pci"}):
            received.append(event)

    with caplog.at_level(logging.WARNING), pytest.raises(TimeoutError):
        async with asyncio.timeout(0.5):
            await collect()
    assert received == []
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "periodic rescan" in warnings[0].getMessage()


async def test_a_bound_socket_first_says_it_listens() -> None:
    stream = kernel_uevents({"pci"})
    try:
        assert await asyncio.wait_for(anext(stream), PATIENCE) == LISTENING
    finally:
        await stream.aclose()


async def test_nothing_to_listen_for_ends_at_once() -> None:
    assert [event async for event in kernel_uevents(())] == []


async def test_listening_can_be_stopped() -> None:
    stream = kernel_uevents({"pci"})
    assert await asyncio.wait_for(anext(stream), PATIENCE) == LISTENING
    pending = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.05)
    pending.cancel()
    with pytest.raises((asyncio.CancelledError, StopAsyncIteration)):
        await pending
    await stream.aclose()


@pytest.mark.parametrize(("uid_map", "expected"), [
    ("         0          0 4294967295\n", True),  # the initial user namespace
    ("         0     100000      65536\n", False),  # a pod with hostUsers: false
    ("         0          0          1\n", False),  # unshare --map-root-user
    (None, False),  # cannot tell: assume not, and rescan often
])
def test_uevents_are_relied_on_only_in_the_initial_user_namespace(
    tmp_path: Path, uid_map: str | None, expected: bool,
) -> None:
    path = tmp_path / "uid_map"
    if uid_map is not None:
        path.write_text(uid_map)
    assert uevents.kernel_sends_uevents_here(path) is expected
