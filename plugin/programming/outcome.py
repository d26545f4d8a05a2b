"""What was done for one device of a prepared claim: which function, and how it got there.

It is recorded with the claim in the driver's checkpoint (the same journal line, no write of
its own), because two things outlive the call that prepared the claim, and may have to
outlive the process: the claim's ``status.devices[]`` shows it for as long as the claim is
prepared (a restarted plugin writes the status again, and without the record that write would
drop it), and the function a DeviceClass clears the device to (``clearOnUnprepare``), carried
by its spec, is loaded when the claim is unprepared.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
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
    """What the checkpoint records of one outcome, without its digests: 0.2.0 builds an
    outcome from every key it finds, so a key it does not know would cost it the claim's
    functions on a rollback. The digests are kept beside (:func:`digests_to_json`)."""
    return _without_digests(asdict(outcome))


def _without_digests(entry: dict[str, Any]) -> dict[str, Any]:
    return {key: _without_digests(value) if isinstance(value, dict) else value
            for key, value in entry.items() if key != "sha256"}


def digests_to_json(outcome: Outcome) -> dict[str, str] | None:
    """The digests of one outcome (the bytes loaded, the pins of its function and of its
    clear), for the claim's ``functionDigests``; None when it has none."""
    found = {"loaded": outcome.sha256, "pinned": outcome.spec.sha256,
             "clearPinned": outcome.spec.clear.sha256 if outcome.spec.clear else None}
    kept = {key: value for key, value in found.items() if value}
    return {"deviceID": outcome.device_id, **kept} if kept else None


def with_digests(outcomes: tuple[Outcome, ...], entries: object) -> tuple[Outcome, ...]:
    """``outcomes`` with the digests ``functionDigests`` kept for them; entries that do not
    read are skipped (a digest lost costs the audit a field, never the claim its record)."""
    if not isinstance(entries, list):
        return outcomes
    by_device = {e["deviceID"]: e for e in entries
                 if isinstance(e, dict) and isinstance(e.get("deviceID"), str)}
    out = []
    for outcome in outcomes:
        entry = by_device.get(outcome.device_id)
        if entry is not None:
            spec = outcome.spec
            clear = spec.clear
            if clear is not None and isinstance(entry.get("clearPinned"), str):
                clear = replace(clear, sha256=entry["clearPinned"])
            pinned = entry.get("pinned")
            spec = replace(spec, clear=clear,
                           sha256=pinned if isinstance(pinned, str) else spec.sha256)
            loaded = entry.get("loaded")
            outcome = replace(outcome, spec=spec,
                              sha256=loaded if isinstance(loaded, str) else None)
        out.append(outcome)
    return tuple(out)


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
