"""What a value must be to go on the wire, and reporting a value that cannot, once.

ListAndWatch sends every device of a resource in one message: a single value protobuf
refuses (an ID that is not UTF-8 text, a NUMA node beyond int64) would fail the whole
stream, and the kubelet would drop the healthy devices with it. The adapters check each
device on its own with these rules and say what they left out, once per value rather than
on every send.
"""

from __future__ import annotations

import logging

MAX_ID_BYTES = 256
"""Longest device ID sent. The plugin's own IDs stay under 30 characters; the bound keeps a
garbage ID from growing the kubelet's checkpoint, and 4096 such IDs far below gRPC's 4 MiB
message limit."""

MAX_REMEMBERED = 4096
"""Reported problems remembered; beyond that the memory starts over (and repeats a report)."""


def id_problem(device_id: object) -> str:
    """Why ``device_id`` cannot be a device ID on the wire, or ``""`` if it can."""
    if not isinstance(device_id, str):
        return f"is a {type(device_id).__name__}, not text"
    if not device_id:
        return "is empty"
    try:
        size = len(device_id.encode("utf-8"))
    except UnicodeEncodeError:
        return "is not valid UTF-8 text"
    if size > MAX_ID_BYTES:
        return f"is {size} bytes long, more than the {MAX_ID_BYTES} sent"
    return ""


def shown_id(device_id: object) -> str:
    """A device ID fit for a log line whatever it holds: escaped and cut short."""
    text = ascii(device_id[:100] if isinstance(device_id, str) else device_id)
    return text if len(text) <= 80 else text[:77] + "..."


class ReportOnce:
    """Logs a warning the first time a (device, problem) pair is seen, debug afterwards.

    A bad device is re-sent on every change of its resource; the operator needs to hear of it
    once, not once per send.
    """

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._seen: set[tuple[str, str]] = set()

    def report(self, device_id: object, message: str) -> None:
        key = (shown_id(device_id), message)
        if key in self._seen:
            self._logger.debug("still: %s", message)
            return
        if len(self._seen) >= MAX_REMEMBERED:
            self._seen.clear()
        self._seen.add(key)
        self._logger.warning("%s", message)
