"""What was done for one device of a prepared claim: which function, and how it got there.

It is recorded with the claim in the driver's checkpoint (the same journal line, no write of
its own), because two things outlive the call that prepared the claim, and may have to
outlive the process: the claim's ``status.devices[]`` shows it for as long as the claim is
prepared (a restarted plugin writes the status again, and without the record that write would
drop it), and the function a DeviceClass clears the device to (``clearOnUnprepare``), carried
by its spec, is loaded when the claim is unprepared.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from plugin.programming.function_config import FunctionSpec

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
    sha256: str | None = None
    """The digest of the bytes loaded (LOADED from an image), which the loader checked."""

    def message(self) -> str:
        if self.result == SKIPPED:
            return f"{self.spec.shown()} was loaded already"
        return f"{self.spec.shown()} loaded by {self.loader} in {self.seconds:.2f} s"


def outcome_to_json(outcome: Outcome) -> dict[str, Any]:
    """What the checkpoint records; a digest only where there is one, so a record without
    one reads the same to a release that knows no digests (0.2.0)."""
    return _without_empty_digests(asdict(outcome))


def _without_empty_digests(entry: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in entry.items():
        if key == "sha256" and value is None:
            continue
        out[key] = _without_empty_digests(value) if isinstance(value, dict) else value
    return out


_SPEC_FIELDS = frozenset(FunctionSpec.__dataclass_fields__)


def _spec(entry: object) -> FunctionSpec:
    if not isinstance(entry, dict):
        raise ValueError(f"not a function: {entry!r}")
    clear = entry.get("clear")
    known = {k: v for k, v in entry.items() if k in _SPEC_FIELDS}
    return FunctionSpec(**{**known, "clear": _spec(clear) if clear else None})


def outcome_from_json(entry: object) -> Outcome:
    """ValueError (or TypeError, KeyError) when ``entry`` is not what :func:`outcome_to_json`
    wrote."""
    if not isinstance(entry, dict):
        raise ValueError(f"not an outcome: {entry!r}")
    outcome = Outcome(**{**entry, "spec": _spec(entry["spec"])})
    if not isinstance(outcome.device_id, str) or outcome.result not in (SKIPPED, LOADED):
        raise ValueError(f"not an outcome: {entry!r}")
    return outcome
