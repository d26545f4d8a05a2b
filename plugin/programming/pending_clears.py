"""Clears asked for and not yet over: a small record in the driver's state directory.

An unprepare removes its claim from the checkpoint, and the clear of its device (its
DeviceClass's ``clearOnUnprepare``) runs after the kubelet's answer. A process killed between
the two would leave the previous tenant's function on the card with nothing left to say so,
and the next claim would receive it. So each clear is written here first, atomically, before
the checkpoint entry goes, and forgotten only once its outcome is known: loaded, held
already, refused, or failed (a failure that may have touched the card quarantines the device,
as any failed load does). A clear cut off (the process stopping before it ended, or killed)
stays here, and the next instance runs it before it offers the device again
(:class:`~plugin.programming.clears.Clears`).

One entry per device: a later clear of the same device replaces an earlier one, since only
the last is what the next tenant would find. The file is JSON, ``{"clears": {device ID:
{"claim": UID, "function": {...}}}}``, rewritten whole at each change (a rename: a reader
sees the old record or the new). Only the instance holding the driver's socket writes it: a
rolling update's newcomer reads it when it takes over, not before.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from plugin.process.files import replace_atomically
from plugin.programming.function_config import FunctionSpec

log = logging.getLogger(__name__)

FILE_NAME = "pending-clears.json"
_SPEC_FIELDS = frozenset(FunctionSpec.__dataclass_fields__) - {"clear"}


@dataclass(frozen=True)
class PendingClear:
    """``device_id`` is to be loaded with ``function`` after claim ``claim`` (its UID)."""

    device_id: str
    claim: str
    function: FunctionSpec


class PendingClears:
    """The record at ``<state_dir>/pending-clears.json`` (``state_dir`` None: memory only)."""

    def __init__(self, state_dir: Path | None) -> None:
        self.path = None if state_dir is None else state_dir / FILE_NAME
        self._entries: dict[str, PendingClear] = {}

    def read(self) -> dict[str, PendingClear]:
        """The record as the file holds it now (what the instance before left), kept as this
        instance's from now on. A file that cannot be read is said and read as empty: the
        clears it held are lost, which the error says."""
        self._entries = {}
        if self.path is None:
            return {}
        try:
            data = json.loads(self.path.read_text())
            entries = data["clears"]
            if not isinstance(entries, dict):
                raise ValueError("clears is not a mapping")
            for device_id, entry in entries.items():
                self._entries[str(device_id)] = _decoded(str(device_id), entry)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, TypeError, KeyError) as exc:
            log.error("pending clears %s cannot be read (%s): a device whose clear was cut off "
                      "may hold the function of its previous claim", self.path, exc)
            self._entries = {}
        return dict(self._entries)

    def add(self, clears: list[PendingClear]) -> None:
        """Record ``clears`` (each replacing its device's entry); OSError when the file
        cannot be written, and then nothing is changed."""
        if not clears:
            return
        after = {**self._entries, **{clear.device_id: clear for clear in clears}}
        self._write(after)
        self._entries = after

    def remove(self, clear: PendingClear) -> None:
        """Forget ``clear`` (if its device's entry is still this one): its outcome is known."""
        if self._entries.get(clear.device_id) != clear:
            return
        after = {d: c for d, c in self._entries.items() if d != clear.device_id}
        try:
            self._write(after)
        except OSError as exc:
            log.error("cannot write %s (%s): the clear of %s after claim %s is over, but a "
                      "restart will run it again", self.path, exc.strerror, clear.device_id,
                      clear.claim)
            return
        self._entries = after

    def _write(self, entries: dict[str, PendingClear]) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        replace_atomically(self.path, json.dumps({"clears": {
            d: {"claim": c.claim, "function": _encoded(c.function)}
            for d, c in sorted(entries.items())}}, sort_keys=True), mode=0o600, sync=False)


def _encoded(spec: FunctionSpec) -> dict[str, Any]:
    return {k: v for k, v in asdict(spec).items() if k != "clear"}


def _decoded(device_id: str, entry: object) -> PendingClear:
    if not isinstance(entry, dict) or not isinstance(entry.get("claim"), str) or \
            not isinstance(entry.get("function"), dict):
        raise ValueError(f"entry of {device_id} is not a pending clear: {entry!r}")
    fields = {k: v for k, v in entry["function"].items() if k in _SPEC_FIELDS}
    return PendingClear(device_id, entry["claim"], FunctionSpec(**fields))
