"""The driver's own record of the claims it prepared, by claim UID, kept on disk.

Why the driver keeps one: NodeUnprepareResources carries only a claim's namespace, name and
UID, and the claim may be gone from the API server by then; a repeated NodePrepareResources
(the kubelet calls again after a restart, or for claims it did not hear back about) must get
the same devices without asking the API server, which may be unreachable. Both must hold
across a restart of the driver, so the record is a file, read at start.

How it is written: a journal. The file is a header line, then one line per change (the
claims put, the UIDs removed), each with a sequence number and a SHA-256 of its own text.
A change is one ``write`` of one line to the end of the file, made on the event loop: a few
hundred bytes into the page cache cost microseconds, where writing the whole record to a
temporary file and renaming it cost about half a millisecond and a worker thread's hop on
every prepare and unprepare (``bench/dra.py`` measures what the kubelet waits). Once the
journal holds more lines than it is worth (:data:`COMPACT_AFTER`, and at least as many as
there are claims, so the rewrite costs O(1) per change), the next change is written as a
whole new file instead: header and one line holding every claim, into a temporary file
renamed over the old one on a worker thread. Readers never see a mix of two records.
A change of major format (:mod:`.checkpoint_format`: 3 while some claim holds a share of a
device, else 2) never leaves a line under a header that says another format than its records
need. The change that records the first share raises the header in place, one byte (``2``
to ``3``, the header otherwise this release's own, byte for byte), then appends its line as
usual: the lines before it are format 2's records, which format 3 reads as they are, and a
byte cannot be torn. Were the line then not written, the file says 3 with no share, which
only a release before shares minds (it refuses the file until the next change rewrites it);
never the other way round. The change that removes the last share rewrites the file whole as
format 2, so that no share record is left in its journal for a reader of 2 to replay.

Why no fsync: the record only has to outlive the driver process (a pod restart between
prepare and unprepare), and the page cache does that. A power cut takes the containers and
``/var/run/cdi`` with it. What it can do to the journal is cut or zero its end: such a torn
tail (a last line cut short, lines holding zeros, after the last good line) is dropped with
a warning, the claims it held are unknown (an unprepare of one is answered as done, a
repeated prepare reads the claim again, which is what the kubelet needs), and the next
change rewrites the file.

What is refused, and how:

* a file in a newer major format (a release rolled back across a format change), or one that
  cannot be read at all (permissions, I/O): logged once as an error naming both formats and
  the release that wrote it, and left exactly as it is, never renamed or written over, so
  the release that wrote it finds it whole when it runs again. Until the file can be read
  (it is tried again at every prepare and unprepare), :meth:`ClaimCheckpoint.unavailable`
  says why and the driver refuses every prepare and unprepare: it cannot know which claims
  it holds, an unprepare answered as done would leave a claim's CDI spec (and the newer
  release's record of it) behind for good, and a prepare would have to write over the file.
  The kubelet calls both again, and they are answered once a release that reads it runs.
* a header that does not parse, is not this kind of file or names a format older than any
  release wrote, a whole line that is not as written (edited, lost, out of order), or damage
  before a good line: moved aside (``<name>.corrupt-<unix time>``, kept for a person to
  read), logged once as an error, and the driver starts with an empty record rather than
  crashing. That is damage no release can read, not a record another release can.

A missing file is simply an empty record.

Changes are applied to memory only once they are in the file: a line that could not be
written whole is cut off again (or, if even that fails, the next change rewrites the file),
so memory and file never disagree.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType

from plugin.process.files import replace_atomically
from plugin.serving.dra.checkpoint_format import (
    FORMAT_MINOR,
    FORMAT_VERSION,
    SHARED_FORMAT_VERSION,
    NewerFormat,
    decode,
    header_line,
    record_line,
    version_for,
    with_changes,
)
from plugin.serving.dra.holdings import DeviceHoldings, holdings_of, holds_a_share
from plugin.serving.dra.prepared import PreparedClaim, describe
from plugin.version import VERSION

log = logging.getLogger(__name__)

COMPACT_AFTER = 512
"""Journal lines after which the next change rewrites the file (if there are fewer claims)."""


class CheckpointError(Exception):
    """The checkpoint could not be written; nothing was changed."""


class CheckpointUnavailable(CheckpointError):
    """The checkpoint cannot be read now (a newer major format, a file that cannot be read):
    nothing may be answered from it, and nothing written over it."""


class ClaimCheckpoint:
    """Claim UID -> :class:`PreparedClaim`, mirrored in the file at ``path``.

    Read once: at construction, or with ``load=False`` at the first use (or
    :meth:`load`), which is how a driver that must wait for another instance to stop
    (a rolling update) reads the record that instance left, not the one it found at
    start. Reads (:meth:`get`, ``in``, iteration) come from memory; :meth:`commit` writes
    the change and only then changes memory. Commits are serialised: a rewrite of the whole
    file runs on a worker thread, and the next change waits for it.
    """

    def __init__(self, path: Path, *, load: bool = True) -> None:
        self.path = Path(path)
        self._loaded: dict[str, PreparedClaim] | None = None
        self._lock = asyncio.Lock()
        self._lines = 0
        """Change lines in the file now (0: no file, or it must be rewritten first)."""
        self.writes = 0
        """Changes written since start, as lines or whole files (tests look at it)."""
        self.rewrites = 0
        """Of those, whole files written."""
        self._refusal: str | None = None
        """Why the file cannot be read, while it cannot (said once per reason)."""
        self._version = 0
        """The major format of the file's header (0: no file yet)."""
        self._shared: frozenset[str] = frozenset()
        """UIDs of the claims recorded that hold a share of a device."""
        if load:
            self.load()

    def load(self) -> None:
        """Read the file now, unless it was read already (later calls do nothing). While it
        cannot be read (:meth:`unavailable`), every call tries again."""
        if self._loaded is None:
            self._loaded = self._load()

    def unavailable(self) -> str | None:
        """Why no claim can be answered from the record now (read again first), or None.

        What the driver tells the kubelet for every claim while the file is in a newer
        major format or cannot be read; it is read again at each call, so a release rolled
        forward, or the file made readable, is answered at the kubelet's next call."""
        self.load()
        return self._refusal if self._loaded is None else None

    @property
    def _claims(self) -> dict[str, PreparedClaim]:
        self.load()
        if self._loaded is None:
            raise CheckpointUnavailable(f"the claim checkpoint {self.path} cannot be read "
                                        f"({self._refusal})")
        return self._loaded

    # -- reading ---------------------------------------------------------------------------

    def get(self, uid: str) -> PreparedClaim | None:
        return self._claims.get(uid)

    def __contains__(self, uid: object) -> bool:
        return uid in self._claims

    def __len__(self) -> int:
        return len(self._claims)

    def held(self) -> int | None:
        """How many claims are recorded, or None before the file is read (never reads it:
        safe from another thread, such as a metrics scrape)."""
        loaded = self._loaded
        return None if loaded is None else len(loaded)

    def __iter__(self) -> Iterator[str]:
        return iter(dict(self._claims))

    @property
    def claims(self) -> Mapping[str, PreparedClaim]:
        """A read-only view of every claim prepared, by UID."""
        return MappingProxyType(self._claims)

    def holders(self, device_id: str, but: str = "") -> list[str]:
        """The recorded claims (other than UID ``but``) holding ``device_id``, described:
        who a load or a clear of the device would change things under."""
        return [describe(claim.ref) for claim in self.claims.values()
                if claim.ref.uid != but and any(d.device_id == device_id
                                                for d in claim.devices)]

    def device_holdings(self) -> DeviceHoldings | None:
        """What the recorded claims hold of each device (whole, or shares' contexts), or
        None before the file is read or while it cannot be (never reads it, as
        :meth:`held`: only the instance holding the driver's socket reads the record)."""
        loaded = self._loaded
        return None if loaded is None else holdings_of(loaded.values())

    def sharing_claims(self) -> list[PreparedClaim]:
        """The recorded claims that hold a share of a device (kept as they change, so a
        claim allocated whole is checked against these alone, not every claim)."""
        claims = self._claims
        return [claims[uid] for uid in self._shared]

    @property
    def format_version(self) -> int:
        """The major format of the file now (0: no file written or read yet)."""
        return self._version

    # -- writing ---------------------------------------------------------------------------

    async def commit(self, put: Iterable[PreparedClaim] = (),
                     remove: Iterable[str] = ()) -> None:
        """Record ``put`` (by UID, replacing) and forget ``remove``, as one change.

        Raises :class:`CheckpointError` (nothing changed, in the file or in memory) when the
        change cannot be written. A rewrite that has started finishes, cancelled or not.
        """
        put = list(put)
        claims = self._claims  # CheckpointUnavailable: never write over what cannot be read
        remove = [uid for uid in dict.fromkeys(remove) if uid in claims]
        if not put and not remove:
            return
        if not self._lock.locked() and self._appendable(put, remove):
            self._append(put, remove)  # no await in it: nothing else can change the record
            return
        if not self._lock.locked() and self._raisable(put, remove):
            self._append(put, remove)
            return
        await asyncio.shield(self._commit(put, remove))

    def _appendable(self, put: list[PreparedClaim], remove: list[str]) -> bool:
        """A line will do: the file is there, not due for compaction, and its header's
        major format is the one the record needs after the change."""
        return self._room_for(put) and \
            version_for(bool(self._shared_after(put, remove))) == self._version

    def _room_for(self, put: list[PreparedClaim]) -> bool:
        """The file is there and not due for compaction after ``put``."""
        return 0 < self._lines < max(COMPACT_AFTER, len(self._claims) + len(put))

    def _raisable(self, put: list[PreparedClaim], remove: list[str]) -> bool:
        """Whether the change records the first share and the header was raised to format 3
        in place for its line (see the module docstring); False: the file is rewritten."""
        if not self._room_for(put) or self._version != FORMAT_VERSION or \
                not self._shared_after(put, remove):
            return False
        old = header_line(FORMAT_VERSION).encode()
        new = header_line(SHARED_FORMAT_VERSION).encode()
        [at] = [i for i, (a, b) in enumerate(zip(old, new, strict=True)) if a != b]
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
            try:
                if os.pread(fd, len(old), 0) != old or os.pwrite(fd, new[at:at + 1], at) != 1:
                    return False  # another release's header (or minor): written whole
            finally:
                os.close(fd)
        except OSError:
            return False  # the whole rewrite says why, or succeeds
        self._version = SHARED_FORMAT_VERSION
        log.info("claim checkpoint %s raised to format %d: a claim holds a share of a device "
                 "(a release reading only format 2 refuses it)", self.path, self._version)
        return True

    def _shared_after(self, put: list[PreparedClaim], remove: list[str]) -> frozenset[str]:
        """The claims holding shares once the change is made (put wins over remove, as in
        :func:`with_changes`); only the change is looked at, not every claim."""
        changed = {claim.ref.uid for claim in put}
        return (self._shared - set(remove) - changed) | \
            {claim.ref.uid for claim in put if holds_a_share(claim)}

    async def _commit(self, put: list[PreparedClaim], remove: list[str]) -> None:
        async with self._lock:
            if self._appendable(put, remove) or self._raisable(put, remove):
                self._append(put, remove)
                return
            claims = with_changes(self._claims, put, remove)
            shared = self._shared_after(put, remove)
            await self._rewrite(claims, version_for(bool(shared)))
            self._loaded = claims
            self._shared = shared
            self.writes += 1

    def _append(self, put: list[PreparedClaim], remove: list[str]) -> None:
        """The change as one line at the end of the file, then in memory."""
        remove = [uid for uid in remove if uid in self._claims]
        line = record_line(self._lines + 1, {c.ref.uid: c for c in put}, remove)
        try:
            _append_line(self.path, line)
        except OSError as exc:
            if not isinstance(exc, _LineNotWritten):
                self._lines = 0  # whatever the file holds now, the next change replaces it
            raise CheckpointError(f"cannot write the claim checkpoint {self.path}: "
                                  f"{exc.strerror or exc}") from exc
        self._lines += 1
        self._shared = self._shared_after(put, remove)
        self._loaded = with_changes(self._claims, put, remove)
        self.writes += 1

    async def _rewrite(self, claims: dict[str, PreparedClaim], version: int) -> None:
        try:
            await asyncio.to_thread(_encode_and_write, self.path, claims, version)
        except OSError as exc:
            raise CheckpointError(f"cannot write the claim checkpoint {self.path}: "
                                  f"{exc.strerror or exc}") from exc
        if version != self._version and self._version:
            log.info("claim checkpoint %s rewritten as format %d: %s", self.path, version,
                     "a claim holds a share of a device (a release reading only format 2 "
                     "refuses it)" if version > self._version else
                     "no claim holds a share of a device any more")
        self._lines = 1
        self._version = version
        self.rewrites += 1

    # -- the file --------------------------------------------------------------------------

    def _load(self) -> dict[str, PreparedClaim] | None:
        """The record, or None (said once per reason) while the file cannot be read."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            log.info("no claim checkpoint at %s yet: no claim prepared", self.path)
            return self._readable({})
        except OSError as exc:
            # Unreadable is not corrupt: the claims it holds are still held.
            return self._refuse(f"cannot read it: {exc.strerror or exc}")
        try:
            journal = decode(raw)
        except NewerFormat as exc:
            return self._refuse(str(exc))
        except ValueError as exc:
            kept = self._set_aside()
            log.error("claim checkpoint %s is unusable (%s); %s; starting with no claim "
                      "prepared: an unprepare of an earlier claim is answered as done, a "
                      "repeated prepare reads the claim again", self.path, exc,
                      f"kept as {kept}" if kept else "it could not be moved aside")
            return {}
        if journal.torn:
            log.warning("claim checkpoint %s ends in %d damaged line(s) after its last good "
                        "one (a power cut?); the changes they held are lost, the next change "
                        "rewrites the file", self.path, journal.torn)
        if journal.minor > FORMAT_MINOR:
            log.info("claim checkpoint %s is format %d.%d (written by %s); this driver (%s) "
                     "knows %d.%d: the fields it does not know are ignored, and dropped "
                     "when it next rewrites the file", self.path, journal.version,
                     journal.minor, journal.written_by, VERSION, journal.version, FORMAT_MINOR)
        self._lines = 0 if journal.torn else journal.lines
        self._version = journal.version
        self._shared = frozenset(uid for uid, claim in journal.claims.items()
                                 if holds_a_share(claim))
        log.info("claim checkpoint %s: %d claim(s) prepared", self.path, len(journal.claims))
        return self._readable(journal.claims)

    def _refuse(self, reason: str) -> None:
        if reason != self._refusal:
            log.error("the claim checkpoint %s cannot be read (%s); it is left as it is, and "
                      "every claim prepare and unprepare is refused until it can be read "
                      "(roll the release that wrote it forward again, or make it readable): "
                      "tried again at each of the kubelet's calls", self.path, reason)
        self._refusal = reason

    def _readable(self, claims: dict[str, PreparedClaim]) -> dict[str, PreparedClaim]:
        if self._refusal is not None:
            log.warning("the claim checkpoint %s can be read again: claims are prepared and "
                        "unprepared again", self.path)
            self._refusal = None
        return claims

    def _set_aside(self) -> Path | None:
        aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
        try:
            os.replace(self.path, aside)
        except OSError:
            return None
        return aside


def _encode_and_write(path: Path, claims: Mapping[str, PreparedClaim], version: int) -> None:
    """On the worker thread: the claims are a snapshot of frozen values."""
    _write_atomically(path, header_line(version) + record_line(1, claims, []))


class _LineNotWritten(OSError):
    """A line could not be written, and the file is as it was before."""


def _append_line(path: Path, line: str) -> None:
    """One ``write`` at the end of the file; a line written short is cut off again."""
    data = line.encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        try:
            if os.write(fd, data) != len(data):
                raise OSError(28, "No space left on device (line written short)")
        except OSError as exc:
            try:
                os.ftruncate(fd, size)
            except OSError:
                raise exc from None  # part of a line left: the caller rewrites the file
            raise _LineNotWritten(exc.errno, exc.strerror) from exc
    finally:
        os.close(fd)


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_atomically(path, text, mode=0o600, sync=False)
