"""The driver's own record of the claims it prepared, by claim UID, kept on disk.

Why the driver keeps one: NodeUnprepareResources carries only a claim's namespace, name and
UID, and the claim may be gone from the API server by then; a repeated NodePrepareResources
(the kubelet calls again after a restart, or for claims it did not hear back about) must get
the same devices without asking the API server, which may be unreachable. Both must hold
across a restart of the driver, so the record is a file, read at start.

How it is written: the whole record as one compact JSON document into a temporary file in
the same directory, renamed over the old file, all on a worker thread. A reader, or a driver
killed at any instant, sees the old record or the new one, never a mix. The document carries
a format version and a SHA-256 of its claims, so a file damaged some other way (a disk error,
a hand edit, a power cut that leaves it empty) is told from a good one.

Why no fsync: the record only has to outlive the driver process (a pod restart between
prepare and unprepare), and the page cache does that. A power cut takes the containers and
``/var/run/cdi`` with it; a record it damages is set aside like any damaged one, after which a
repeated prepare reads the claim again and an unprepare of an unknown claim is answered as
done, which is what the kubelet needs. An fsync on every call was most of the difference
between this driver's prepare and a minimal one's (``bench/dra.py``).

What is refused: a file that does not parse, has the wrong checksum or a format this code
does not know is moved aside (``<name>.corrupt-<unix time>``, kept for a person to read),
logged once as an error, and the driver starts with an empty record rather than crashing:
claims prepared before are then unknown, so their unprepare is answered as done, and a
repeated prepare reads the claim again. A missing file is simply an empty record.

Changes are applied to memory only once they are on disk, and a change already handed to
the writer completes even if its caller is cancelled (a stop, a kubelet giving up): memory
and file never disagree.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from plugin.serving.dra.prepared import PreparedClaim
from plugin.serving.files import replace_atomically

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
"""Bumped on any change a reader of the previous format would misread."""
KIND = "AcceleratorDraClaimCheckpoint"


class CheckpointError(Exception):
    """The checkpoint could not be written; nothing was changed."""


class ClaimCheckpoint:
    """Claim UID -> :class:`PreparedClaim`, mirrored in the file at ``path``.

    Read once: at construction, or with ``load=False`` at the first use (or
    :meth:`load`), which is how a driver that must wait for another instance to stop
    (a rolling update) reads the record that instance left, not the one it found at
    start. Reads (:meth:`get`, ``in``, iteration) come from memory; :meth:`commit` writes
    the whole record and only then changes memory. Writes are serialised (one writer at a
    time) and run on a worker thread so the event loop keeps answering while the disk
    syncs.
    """

    def __init__(self, path: Path, *, load: bool = True) -> None:
        self.path = Path(path)
        self._loaded: dict[str, PreparedClaim] | None = None
        self._lock = asyncio.Lock()
        self.writes = 0
        """Files written since start (tests and metrics look at it)."""
        if load:
            self.load()

    def load(self) -> None:
        """Read the file now, unless it was read already (later calls do nothing)."""
        if self._loaded is None:
            self._loaded = self._load()

    @property
    def _claims(self) -> dict[str, PreparedClaim]:
        self.load()
        assert self._loaded is not None
        return self._loaded

    @_claims.setter
    def _claims(self, claims: dict[str, PreparedClaim]) -> None:
        self._loaded = claims

    # -- reading ---------------------------------------------------------------------------

    def get(self, uid: str) -> PreparedClaim | None:
        return self._claims.get(uid)

    def __contains__(self, uid: object) -> bool:
        return uid in self._claims

    def __len__(self) -> int:
        return len(self._claims)

    def __iter__(self) -> Iterator[str]:
        return iter(dict(self._claims))

    @property
    def claims(self) -> Mapping[str, PreparedClaim]:
        """A read-only view of every claim prepared, by UID."""
        return MappingProxyType(self._claims)

    # -- writing ---------------------------------------------------------------------------

    async def commit(self, put: Iterable[PreparedClaim] = (),
                     remove: Iterable[str] = ()) -> None:
        """Record ``put`` (by UID, replacing) and forget ``remove``, in one write.

        Raises :class:`CheckpointError` (nothing changed, on disk or in memory) when the file
        cannot be written. Once the write has started it finishes, cancelled or not.
        """
        put, remove = list(put), list(remove)
        if not put and not any(uid in self._claims for uid in remove):
            return
        await asyncio.shield(self._commit(put, remove))

    async def _commit(self, put: list[PreparedClaim], remove: list[str]) -> None:
        async with self._lock:
            claims = dict(self._claims)
            for uid in remove:
                claims.pop(uid, None)
            for claim in put:
                claims[claim.ref.uid] = claim
            try:
                await asyncio.to_thread(_encode_and_write, self.path, claims)
            except OSError as exc:
                raise CheckpointError(f"cannot write the claim checkpoint {self.path}: "
                                      f"{exc.strerror or exc}") from exc
            self._claims = claims
            self.writes += 1

    # -- the file --------------------------------------------------------------------------

    def _load(self) -> dict[str, PreparedClaim]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            log.info("no claim checkpoint at %s yet: no claim prepared", self.path)
            return {}
        except OSError as exc:
            # Unreadable is not corrupt: leave the file alone for the next start to try.
            log.error("cannot read the claim checkpoint %s (%s); starting with no claim "
                      "prepared", self.path, exc.strerror or exc)
            return {}
        try:
            claims = _decode(raw)
        except ValueError as exc:
            kept = self._set_aside()
            log.error("claim checkpoint %s is unusable (%s); %s; starting with no claim "
                      "prepared: an unprepare of an earlier claim is answered as done, a "
                      "repeated prepare reads the claim again", self.path, exc,
                      f"kept as {kept}" if kept else "it could not be moved aside")
            return {}
        log.info("claim checkpoint %s: %d claim(s) prepared", self.path, len(claims))
        return claims

    def _set_aside(self) -> Path | None:
        aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
        try:
            os.replace(self.path, aside)
        except OSError:
            return None
        return aside


def _encode_and_write(path: Path, claims: Mapping[str, PreparedClaim]) -> None:
    """On the worker thread: the claims are a snapshot of frozen values."""
    _write_atomically(path, _encode(claims))


def _encode(claims: Mapping[str, PreparedClaim]) -> str:
    """The document, with the claims serialised once: canonical and compact, so the same
    text is both what is checksummed and what is written (C encoder, no indentation)."""
    body = _canonical({uid: claims[uid].to_json() for uid in claims})
    digest = "sha256:" + hashlib.sha256(body.encode()).hexdigest()
    return (f'{{"checksum":{json.dumps(digest)},"claims":{body},"kind":{json.dumps(KIND)},'
            f'"version":{FORMAT_VERSION}}}\n')


def _canonical(body: Mapping[str, Any]) -> str:
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def _checksum(body: Mapping[str, Any]) -> str:
    return "sha256:" + hashlib.sha256(_canonical(body).encode()).hexdigest()


def _decode(raw: bytes) -> dict[str, PreparedClaim]:
    """The claims of a checkpoint file; ValueError saying what is wrong with it."""
    try:
        document = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(document, dict) or document.get("kind") != KIND:
        raise ValueError(f"not a {KIND} document")
    if document.get("version") != FORMAT_VERSION:
        raise ValueError(f"format version {document.get('version')!r:.20}, this driver reads "
                         f"{FORMAT_VERSION}")
    body = document.get("claims")
    if not isinstance(body, dict) or not all(isinstance(v, dict) for v in body.values()):
        raise ValueError("'claims' is not an object of objects")
    if document.get("checksum") != _checksum(body):
        raise ValueError("checksum mismatch")
    return {uid: PreparedClaim.from_json(uid, data) for uid, data in body.items()}


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_atomically(path, text, mode=0o600, sync=False)
