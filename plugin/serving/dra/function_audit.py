"""Who loaded what, from which bytes, onto which device: one record per load or refusal.

A shared cluster's security review asks this of every load, long after the pod is gone, so
each function a claim's configuration names leaves one record, wherever it ends: loaded,
held already, refused (the class does not allow it, the image is wrong or its digest is not
the pinned one, the device cannot be programmed or is held; a share of a device that holds
another function, ``not_held``; a guarded function for a namespace not granted it,
``not_granted``), or failed at the card. The
record names the claim (namespace, name, UID), the pods it is reserved for, the DeviceClass,
the function, the image and its digest, the node, the device and the outcome, and goes to:

* one structured log line (logger ``plugin.audit``; with ``--log-format json`` its fields
  are an ``audit`` object of the line, for a collector to index); ``skipped``, which loads
  nothing, only at debug level, so the fast path costs no line;
* an Event regarding the ResourceClaim (``kubectl describe resourceclaim`` shows it), for
  every outcome but ``skipped``, which changes nothing;
* the claim's ``status.devices[]`` entry of the device (:mod:`.claim_status`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass

log = logging.getLogger("plugin.audit")

LOADED = "loaded"
SKIPPED = "skipped"
NOT_ALLOWED = "not_allowed"
DIGEST_MISMATCH = "digest_mismatch"
REFUSED = "refused"
FAILED = "failed"
NOT_HELD = "not_held"
"""A share of a device whose function is not the one the device holds: a share never
programs (:mod:`.shares`), so nothing is loaded."""
NOT_GRANTED = "not_granted"
"""A device holding (or to be loaded with) a guarded function, for a claim whose namespace
is not granted it (:mod:`.function_grants`): nothing is loaded."""

EVENT_REASONS = {
    LOADED: "FunctionLoaded",
    NOT_ALLOWED: "FunctionNotAllowed",
    DIGEST_MISMATCH: "ImageDigestMismatch",
    REFUSED: "FunctionLoadRefused",
    FAILED: "FunctionLoadFailed",
    NOT_HELD: "FunctionNotHeld",
    NOT_GRANTED: "FunctionNotGranted",
}
"""The Event reason regarding the claim, per outcome (``skipped`` writes none)."""
CONDITION_REASONS = {
    LOADED: "Loaded", SKIPPED: "AlreadyLoaded", NOT_ALLOWED: "NotAllowed",
    DIGEST_MISMATCH: "DigestMismatch", REFUSED: "Refused", FAILED: "LoadFailed",
    NOT_HELD: "NotHeld", NOT_GRANTED: "NotGranted",
}
"""The ``FunctionLoaded`` condition's reason in the claim's status, per outcome."""


@dataclass(frozen=True)
class FunctionAudit:
    """One device of one claim whose configuration named a function, and what came of it."""

    outcome: str
    namespace: str
    claim: str
    uid: str
    pods: tuple[str, ...]
    device_class: str
    function: str
    """As users and vendor tools print it: ``afuID d8424dc4-...``."""
    image: str | None
    sha256: str | None
    """The digest of the image's bytes where it was taken (the bytes loaded, for a load)."""
    node: str
    device: str
    """The DRA device name, ``<pool>/<device>``."""
    device_id: str
    detail: str
    share_id: str | None = None
    """Set when the claim holds one share of the device (its claim status entry is keyed
    by it)."""

    @property
    def ok(self) -> bool:
        return self.outcome in (LOADED, SKIPPED)

    def fields(self) -> dict[str, object]:
        """The record as the log's ``audit`` object: every field, ``pods`` as a list;
        ``share_id`` only for a share."""
        fields = asdict(self)
        fields["pods"] = list(self.pods)
        if self.share_id is None:
            del fields["share_id"]
        return fields

    def line(self) -> str:
        """The record as one log line: ``key=value`` pairs, values quoted where needed."""
        parts = []
        for key, value in self.fields().items():
            if isinstance(value, list):
                value = ",".join(value) or "-"
            shown = "-" if value in (None, "") else str(value)
            parts.append(f"{key}={_quoted(shown)}")
        return "function audit: " + " ".join(parts)

    def note(self) -> str:
        """The Event's note: what happened, to which device, from which bytes, for whom."""
        image = f" from image {self.image}" if self.image else ""
        digest = f" (sha256 {self.sha256})" if self.sha256 else ""
        pods = f" for pod {', '.join(self.pods)}" if self.pods else ""
        share = f" share {self.share_id} of" if self.share_id else ""
        return (f"{self.outcome}: {self.function}{image}{digest} on{share} device {self.device} "
                f"({self.device_id}) of node {self.node}, class {self.device_class}"
                f"{pods}: {self.detail}")


def _quoted(value: str) -> str:
    if value and not any(c in value for c in ' "=\\'):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


ClaimTold = Callable[[str, str, str, str, str, str], None]
"""``(namespace, name, uid, type, reason, note)``: an Event regarding a ResourceClaim."""


class Auditor:
    """Writes each record to the log and, where Events are on, regarding its claim."""

    def __init__(self, told: ClaimTold | None = None,
                 status: Callable[[FunctionAudit], None] | None = None) -> None:
        self._told = told
        self._status = status

    @staticmethod
    def skips_recorded() -> bool:
        """Whether a ``skipped`` outcome (nothing loaded: the fast path) is worth a record:
        only at debug level, so the fast path costs no log line."""
        return log.isEnabledFor(logging.DEBUG)

    def record(self, audit: FunctionAudit) -> None:
        level = logging.DEBUG if audit.outcome == SKIPPED else \
            logging.INFO if audit.ok else logging.WARNING
        log.log(level, "%s", audit.line(), extra={"audit": audit.fields()})
        reason = EVENT_REASONS.get(audit.outcome)
        if self._told is not None and reason is not None:
            kind = "Normal" if audit.ok else "Warning"
            self._told(audit.namespace, audit.claim, audit.uid, kind, reason, audit.note())
        if self._status is not None:
            self._status(audit)
