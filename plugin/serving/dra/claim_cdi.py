"""A claim's own CDI spec: the environment its containers get, since DRA has no env field.

A device plugin's Allocate returns ``envs``; NodePrepareResources returns only devices and
their CDI IDs. Containers still expect ``ACCELERATOR_UNITS`` (and ``ACCELERATOR_DEVICES`` for
PCI devices), so each prepared claim gets a spec of its own in the CDI directory, kind
``<driver>/claim``, with one device per request of the claim whose ``containerEdits.env``
holds that request's device IDs in allocation order. Its CDI ID is added to the first
device of that request only: the kubelet hands a container the CDI IDs of the devices of the
request it names, so each container gets its own request's variables exactly once (the CDI
library appends the env of every injected device, and a variable set twice with different
values is up to the runtime). The devices' own nodes stay in the per-resource specs the
daemon writes (:mod:`plugin.serving.cdi`); this spec carries environment only.

A request holding shares of devices (KEP-5075) also gets ``ACCELERATOR_SHARE_ID`` and
``ACCELERATOR_SHARE_CONTEXTS``, aligned with its device IDs: each share is its own claim, so
each pod on a shared device gets its own spec and sees its own share.

Why per request and not per claim: a claim of several requests can serve several
containers (KEP-5004 extended-resource claims have one request per container), and each
must see only its own devices, as Allocate gave each container its own IDs. A container that
takes a whole claim of several requests gets each request's variables (docs/dra.md,
"containers").

Rules of :mod:`plugin.serving.cdi` hold: ``cdiVersion`` 0.5.0 (device names may start with a
digit, as claim UIDs do), no dot in the class, no device with empty edits (every device here
has env), atomic writes. Files are ``<vendor>_claim_<uid>.json``: one per claim, removed at
unprepare, and recognisable by UID even when the checkpoint forgot the claim.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from plugin.model.allocation import (
    ENV_DEVICES,
    ENV_SHARE_CONTEXTS,
    ENV_SHARE_ID,
    ENV_UNITS,
    UNITS_BACKEND,
)
from plugin.process.files import replace_atomically
from plugin.serving.cdi import device_name, kind_of
from value_types.devices import DeviceSet

log = logging.getLogger(__name__)

CDI_VERSION = "0.5.0"
"""What every spec of this project declares (see :mod:`plugin.serving.cdi`)."""
CLAIM_CLASS = "claim"


def accelerator_env(device_ids: Sequence[str], devices: DeviceSet) -> dict[str, str]:
    """The variables a container gets for ``device_ids``, as Allocate gives them:
    ``ACCELERATOR_UNITS`` always, ``ACCELERATOR_DEVICES`` unless every device is a unit."""
    joined = ",".join(device_ids)
    env = {ENV_UNITS: joined}
    known = [d for i in device_ids if (d := devices.get(i)) is not None]
    if not known or any(d.backend != UNITS_BACKEND for d in known):
        env[ENV_DEVICES] = joined
    return env


Share = tuple[str, int] | None
"""A device's (share ID, contexts) in a request, or None for a device held whole."""


def share_env(shares: Sequence[Share]) -> dict[str, str]:
    """The share variables of a request whose devices are ``shares`` (in the order of its
    device IDs): none when every device is held whole."""
    if all(share is None for share in shares):
        return {}
    return {ENV_SHARE_ID: ",".join(share[0] if share else "" for share in shares),
            ENV_SHARE_CONTEXTS: ",".join(str(share[1]) if share else "" for share in shares)}


class ClaimSpecs:
    """Writes and removes the per-claim CDI specs of one driver in ``directory``.

    ``env(device_ids)`` says what a container gets for those IDs; the daemon passes
    ``lambda ids: accelerator_env(ids, feed.current)``. Methods block on the file system:
    call them from a worker thread.
    """

    def __init__(self, directory: Path, driver: str,
                 env: Callable[[Sequence[str]], Mapping[str, str]]) -> None:
        self.directory = Path(directory)
        self.kind = kind_of(f"{driver}/{CLAIM_CLASS}")
        self._vendor = self.kind.split("/", 1)[0]
        self._env = env

    def file_name(self, claim_uid: str) -> str:
        return f"{self._vendor}_{CLAIM_CLASS}_{device_name(claim_uid)}.json"

    def spec(self, claim_uid: str, requests: Mapping[str, Sequence[str]],
             shares: Mapping[str, Sequence[Share]] | None = None) -> dict[str, Any]:
        """The spec of a claim whose base requests got these device IDs (in order), and
        these shares of them (``shares``: request -> aligned with its IDs)."""
        shares = shares or {}
        devices = [{"name": self.device_name(claim_uid, request),
                    "containerEdits": {"env": [f"{k}={v}" for k, v in sorted(
                        {**self._env(list(ids)),
                         **share_env(shares.get(request, ()))}.items())]}}
                   for request, ids in requests.items()]
        return {"cdiVersion": CDI_VERSION, "kind": self.kind, "devices": devices}

    def device_name(self, claim_uid: str, request: str) -> str:
        return device_name(f"{claim_uid}-{request}")

    def qualified(self, claim_uid: str, request: str) -> str:
        """The CDI ID of one request's environment device."""
        return f"{self.kind}={self.device_name(claim_uid, request)}"

    def write(self, claim_uid: str, requests: Mapping[str, Sequence[str]],
              shares: Mapping[str, Sequence[Share]] | None = None) -> str:
        """Write the claim's spec; its file name. OSError when the directory refuses."""
        name = self.file_name(claim_uid)
        # Compact, so the C encoder does it: the write is on the kubelet's critical path.
        text = json.dumps(self.spec(claim_uid, requests, shares), sort_keys=True) + "\n"
        # No fsync: claim specs matter only while the node is up (/var/run/cdi is a tmpfs).
        try:
            replace_atomically(self.directory / name, text, sync=False)
        except FileNotFoundError:  # the directory was removed (or never made)
            self.directory.mkdir(parents=True, exist_ok=True)
            replace_atomically(self.directory / name, text, sync=False)
        return name

    def remove(self, claim_uid: str, file_name: str | None = None) -> None:
        """Remove the claim's spec (by recorded name, else by UID); absent is fine."""
        for name in dict.fromkeys(n for n in (file_name, self.file_name(claim_uid)) if n):
            try:
                (self.directory / name).unlink(missing_ok=True)
            except OSError as exc:
                log.warning("cannot remove the CDI spec %s of claim %s: %s",
                            self.directory / name, claim_uid, exc.strerror or exc)
