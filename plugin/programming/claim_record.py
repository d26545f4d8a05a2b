"""What was done for each prepared claim's devices, kept beside the claim checkpoint.

Two things outlive the call that prepared a claim, and may have to outlive the process:

* the outcome (which function, from which image, loaded by what or held already), which the
  claim's ``status.devices[]`` shows for as long as the claim is prepared; a restarted plugin
  writes the claim's status again, and without the record that write would drop it;
* the function a DeviceClass clears the device to (``clearOnUnprepare``), loaded when the
  claim is unprepared, which may come to a restarted plugin.

The file is read when the object is made and again when this instance takes the driver's
socket (a rolling update's newcomer must not act on what the old one wrote before it
stopped), and written whole, atomically, only by the instance that holds the socket.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from plugin.programming.function_config import FunctionSpec
from plugin.serving.files import replace_atomically

log = logging.getLogger(__name__)

FILE_NAME = "programming-claims.json"
SKIPPED = "skipped"
LOADED = "loaded"


@dataclass(frozen=True)
class Outcome:
    """What was done for one device of one claim: ``result`` :data:`SKIPPED` (held
    already) or :data:`LOADED` (by ``loader``, in ``seconds``)."""

    device_id: str
    spec: FunctionSpec
    result: str
    loader: str = ""
    seconds: float = 0.0

    def message(self) -> str:
        if self.result == SKIPPED:
            return f"{self.spec.shown()} was loaded already"
        return f"{self.spec.shown()} loaded by {self.loader} in {self.seconds:.2f} s"


class ClaimRecord:
    """Claim UID -> device ID -> its :class:`Outcome` (whose spec carries the clear)."""

    def __init__(self, state_dir: Path | None) -> None:
        self.path = None if state_dir is None else state_dir / FILE_NAME
        self.claims: dict[str, dict[str, Outcome]] = {}
        self.owned = False
        """True once this instance holds the driver's socket: only then does it write."""
        self._read()

    def take_ownership(self) -> None:
        """This instance holds the socket now: what the file says is the truth."""
        self.owned = True
        self._read()

    def put(self, uid: str, outcome: Outcome) -> None:
        if self.claims.get(uid, {}).get(outcome.device_id) == outcome:
            return
        self.claims.setdefault(uid, {})[outcome.device_id] = outcome
        self._save()

    def get(self, uid: str, device_id: str) -> Outcome | None:
        return self.claims.get(uid, {}).get(device_id)

    def take(self, uid: str) -> dict[str, Outcome]:
        """Claim ``uid``'s outcomes, forgotten from now on (unprepared, or refused)."""
        taken = self.claims.pop(uid, {})
        if taken:
            self._save()
        return taken

    def _read(self) -> None:
        if self.path is None:
            return
        try:
            data = json.loads(self.path.read_text())
            self.claims = {uid: {device_id: _outcome(entry) for device_id, entry in
                                 devices.items()} for uid, devices in data["claims"].items()}
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.error("%s cannot be read (%s); claims prepared before show no function in "
                      "their status, and their devices are not cleared when unprepared",
                      self.path, exc)

    def _save(self) -> None:
        if self.path is None or not self.owned:
            return
        data = {"claims": {uid: {device_id: _entry(outcome)
                                 for device_id, outcome in devices.items()}
                           for uid, devices in self.claims.items()}}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            replace_atomically(self.path, json.dumps(data, sort_keys=True))
        except OSError as exc:
            log.error("cannot write %s (%s); a restart would forget what was loaded for "
                      "the claims prepared now", self.path, exc.strerror)


def _entry(outcome: Outcome) -> dict[str, Any]:
    return asdict(outcome)


def _spec(entry: dict[str, Any]) -> FunctionSpec:
    clear = entry.get("clear")
    return FunctionSpec(**{**entry, "clear": _spec(clear) if clear else None})


def _outcome(entry: dict[str, Any]) -> Outcome:
    return Outcome(**{**entry, "spec": _spec(entry["spec"])})
