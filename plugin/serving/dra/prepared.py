"""What preparing a claim produced: the values the checkpoint keeps and the kubelet is told.

No wire type here: :mod:`api_versions.dra_plugin` turns a
:class:`~value_types.claims.ClaimResult` into whichever ``NodePrepareResourceResponse`` the
kubelet's service spells, and the checkpoint stores a :class:`PreparedClaim` as JSON.
Keeping one shape for both is what makes a repeated NodePrepareResources answer exactly what
the first one did, even across a restart.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from plugin.programming.outcome import (
    Outcome,
    digests_to_json,
    outcome_from_json,
    outcome_to_json,
    with_digests,
)
from value_types.claims import ClaimRef, PreparedDevice, text_field

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PreparedClaim:
    """A claim this driver prepared: what the checkpoint holds per claim UID."""

    ref: ClaimRef
    devices: tuple[PreparedDevice, ...]
    claim_spec: str | None = None
    """File name of the claim's own CDI spec (its environment) in the CDI directory."""
    functions: tuple[Outcome, ...] = ()
    """For each device whose request named a function: what was done (checkpoint minor 2;
    a release before it reads past the field)."""

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"namespace": self.ref.namespace, "name": self.ref.name,
                                "devices": [d.to_json() for d in self.devices]}
        if self.claim_spec is not None:
            data["claimSpec"] = self.claim_spec
        if self.functions:
            data["functions"] = [outcome_to_json(o) for o in self.functions]
            digests = [d for o in self.functions if (d := digests_to_json(o)) is not None]
            if digests:  # beside the functions, which 0.2.0 reads key by key (minor 3)
                data["functionDigests"] = digests
        return data

    def function(self, device_id: str) -> Outcome | None:
        """What was done to give ``device_id`` the function its request named, if any."""
        return next((o for o in self.functions if o.device_id == device_id), None)

    @classmethod
    def from_json(cls, uid: str, data: dict[str, Any]) -> PreparedClaim:
        devices = data.get("devices")
        if not isinstance(devices, list) or not all(isinstance(d, dict) for d in devices):
            raise ValueError(f"claim {uid}: 'devices' is not a list of objects")
        spec = data.get("claimSpec")
        if spec is not None and not isinstance(spec, str):
            raise ValueError(f"claim {uid}: 'claimSpec' is not text")
        return cls(ClaimRef(text_field(data, "namespace"), text_field(data, "name"), uid),
                   tuple(PreparedDevice.from_json(d) for d in devices), spec,
                   with_digests(_functions(uid, data.get("functions")),
                                data.get("functionDigests")))


def describe(ref: ClaimRef) -> str:
    """How log lines and errors name a claim: ``namespace/name (uid)``."""
    return f"{ref.namespace}/{ref.name} ({ref.uid})"


def _functions(uid: str, entries: object) -> tuple[Outcome, ...]:
    """The claim's function outcomes; a malformed list costs the status its function
    fields (and the device its clear), never the claim its record."""
    if entries is None:
        return ()
    try:
        if not isinstance(entries, list):
            raise TypeError("not a list")
        return tuple(outcome_from_json(entry) for entry in entries)
    except (TypeError, ValueError, KeyError) as exc:
        log.warning("claim %s: its recorded functions cannot be read (%s); kept without them",
                    uid, exc)
        return ()
