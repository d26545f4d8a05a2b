"""Functions to load when a claim is unprepared: a DeviceClass's ``clearOnUnprepare``.

An admin may want a card left holding a known, harmless function once a pod is done with it
(no customer logic left on the card for the next tenant). The class names that function; it
is recorded when the claim is prepared and loaded when the claim is unprepared, after the
kubelet's answer (unprepare never waits on a load). The record is kept in the driver's state
directory beside the claim checkpoint, because unprepare may come to a restarted plugin.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from plugin.programming.function_config import FunctionSpec

log = logging.getLogger(__name__)

FILE_NAME = "programming-clears.json"


class PendingClears:
    """Claim UID -> device ID -> the function to load once the claim is unprepared."""

    def __init__(self, state_dir: Path | None) -> None:
        self.path = None if state_dir is None else state_dir / FILE_NAME
        self.pending: dict[str, dict[str, FunctionSpec]] = {}
        self._read()

    def record(self, uid: str, device_id: str, clear: FunctionSpec) -> None:
        if self.pending.get(uid, {}).get(device_id) == clear:
            return
        self.pending.setdefault(uid, {})[device_id] = clear
        self._save()

    def take(self, uid: str) -> dict[str, FunctionSpec]:
        """What claim ``uid``'s unprepare must load, forgotten from now on."""
        taken = self.pending.pop(uid, {})
        if taken:
            self._save()
        return taken

    def _read(self) -> None:
        if self.path is None:
            return
        try:
            data = json.loads(self.path.read_text())
            self.pending = {
                uid: {device_id: FunctionSpec(**entry) for device_id, entry in devices.items()}
                for uid, devices in data["claims"].items()}
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.error("%s cannot be read (%s); devices of claims prepared before are not "
                      "cleared when they are unprepared", self.path, exc)

    def _save(self) -> None:
        if self.path is None:
            return
        data = {"claims": {uid: {device_id: {
            "family": spec.family, "field": spec.field, "function_id": spec.function_id,
            "image": spec.image, "where": spec.where} for device_id, spec in devices.items()}
            for uid, devices in self.pending.items()}}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temporary = self.path.with_suffix(".tmp")
            temporary.write_text(json.dumps(data, sort_keys=True))
            os.replace(temporary, self.path)
        except OSError as exc:
            log.error("cannot write %s (%s); a restart would forget which devices to clear "
                      "when their claims are unprepared", self.path, exc.strerror)
