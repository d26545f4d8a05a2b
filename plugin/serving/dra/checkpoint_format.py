"""The checkpoint file's format: a header line, then one checksummed line per change.

Kept apart from :mod:`plugin.serving.dra.checkpoint`, which decides when to append a line
and when to rewrite the file, because this is what releases must agree on.

What a format version carries (the rule in CHANGELOG.md, "Checkpoint rule"): the header's
``version`` is the major format, changed only when existing content changes meaning; within
one, a release only adds optional fields, and every reader ignores the fields it does not
know, in the header, around a line's record, in the record, in a claim and in a device. The
header also says ``minor`` (fields added within the major format; 2.0 is 0.1.0's, which
wrote no ``minor``) and ``writtenBy`` (the release that last wrote the file whole), both only
for what the logs say. Each line's checksum is of its record re-serialised canonically
(sorted keys, no spaces, ASCII), so a field a newer release added inside a record is covered
by the checksum, verified and ignored, never taken for damage.

Two major formats are written, chosen by what the file holds: 3 while some claim holds a
share of a device, 2 otherwise (:data:`SHARED_FORMAT_VERSION`). A share changes what a
device record means (one owner of the device among several, not its only one), so a release
that reads only 2 must refuse the file rather than misread it; a file without shares stays
readable by it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from plugin.serving.dra.prepared import PreparedClaim
from plugin.version import VERSION

FORMAT_VERSION = 2
"""The major format written while no claim holds a share of a device: bumped only when
existing content changes meaning, so that a reader of the previous one would misread it (1:
one JSON document rewritten whole on every change, never released)."""
SHARED_FORMAT_VERSION = 3
"""The major format written while some claim holds a share of a device (a device record
with ``shareID`` and ``contexts``). A reader of format 2 would take each share for the whole
device (and, on a rollback, run a class's ``clearOnUnprepare`` under the other shares), so
such a file must be refused by it, as 0.2.0 refuses a newer major format; once no share is
recorded the file is rewritten as format 2, so a rollback without sharing still works."""
READ_VERSIONS = (FORMAT_VERSION, SHARED_FORMAT_VERSION)
"""The major formats this release reads (0.2.0 read only 2)."""
FORMAT_MINOR = 3
"""Optional fields added within the major format (0: 0.1.0's, whose header has no ``minor``;
1: the header's ``minor`` and ``writtenBy``; 2: a claim's ``functions``, what was done to give
its devices the functions their requests named; 3: a claim's ``functionDigests``, the digests
of the bytes loaded and of the pins, kept beside ``functions`` so that a release reading
those key by key meets none it does not know). Readers never refuse a higher one."""
KIND = "AcceleratorDraClaimCheckpoint"


class NewerFormat(ValueError):
    """The file is in a major format newer than this code reads: not damage, a record this
    release cannot read and must leave alone."""


@dataclass(frozen=True)
class Journal:
    """What a checkpoint file held: the claims, its good lines, the damaged ones at its end,
    and what its header said of its format."""

    claims: dict[str, PreparedClaim]
    lines: int
    torn: int
    minor: int = 0
    written_by: str = "a release before 0.2.0"
    version: int = FORMAT_VERSION


def with_changes(claims: Mapping[str, PreparedClaim], put: list[PreparedClaim],
             remove: list[str]) -> dict[str, PreparedClaim]:
    changed = dict(claims)
    for uid in remove:
        changed.pop(uid, None)
    for claim in put:
        changed[claim.ref.uid] = claim
    return changed


def header_line(version: int = FORMAT_VERSION) -> str:
    """What 0.1.0 reads too: it checks ``kind`` and ``version`` and ignores the rest.
    ``version`` is :func:`version_for` the claims the file holds."""
    return (f'{{"kind":{json.dumps(KIND)},"version":{version},'
            f'"minor":{FORMAT_MINOR},"writtenBy":{json.dumps(VERSION)}}}\n')


def version_for(shares_recorded: bool) -> int:
    """The major format of a file that records shares of devices, or none."""
    return SHARED_FORMAT_VERSION if shares_recorded else FORMAT_VERSION


def versions_read() -> str:
    """``format version 2`` or ``format versions 2 and 3``: what this release reads."""
    *first, last = READ_VERSIONS
    if not first:
        return f"format version {last}"
    return f"format versions {', '.join(map(str, first))} and {last}"


def record_line(seq: int, put: Mapping[str, PreparedClaim], remove: list[str]) -> str:
    """One change as one line: the record serialised once, canonical and compact, so the
    same text is both what is checksummed and what is written (C encoder)."""
    record = canonical({"put": {uid: put[uid].to_json() for uid in put},
                         "remove": remove, "seq": seq})
    return f'{{"checksum":{json.dumps(checksum(record))},"record":{record}}}\n'


def canonical(body: Mapping[str, Any]) -> str:
    return json.dumps(body, sort_keys=True, separators=(",", ":"))


def checksum(canonical: str) -> str:
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def decode(raw: bytes) -> Journal:
    """The claims of a checkpoint file; ValueError saying what is wrong with it."""
    header, _, rest = raw.partition(b"\n")
    try:
        document = json.loads(header)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"header is not JSON: {exc}") from None
    if not isinstance(document, dict) or document.get("kind") != KIND:
        raise ValueError(f"not a {KIND} file")
    version, minor = header_fields(document)
    written_by = document.get("writtenBy")
    written_by = (f"release {written_by:.40}" if isinstance(written_by, str)
                  else "a release before 0.2.0")
    if version > max(READ_VERSIONS):
        raise NewerFormat(f"format version {version}, written by {written_by}; this driver "
                          f"(release {VERSION}) reads {versions_read()}")
    if version not in READ_VERSIONS:
        raise ValueError(f"format version {version}, older than any release wrote; this "
                         f"driver reads {versions_read()}")
    pieces = rest.split(b"\n")
    whole, tail = pieces[:-1], pieces[-1]  # no newline after the tail: a line cut short
    claims: dict[str, PreparedClaim] = {}
    damaged: tuple[int, str] | None = None
    good = 0
    for number, line in enumerate(whole, start=2):
        try:
            record = record_of(line)
        except ValueError as exc:
            if b"\0" not in line:  # whole, but not as written: not what a power cut leaves
                raise ValueError(f"line {number}: {exc}") from None
            damaged = damaged or (number, str(exc))
            continue
        if damaged is not None:  # a power cut damages the end, not the middle
            raise ValueError(f"line {damaged[0]}: {damaged[1]}")
        good += 1
        if record["seq"] != good:
            raise ValueError(f"line {number}: change {record['seq']!r:.20} where change "
                             f"{good} belongs (a line lost or moved)")
        apply_record(claims, record)
    return Journal(claims, good, len(whole) - good + (1 if tail else 0), minor, written_by,
                   version)


def header_fields(document: dict[str, Any]) -> tuple[int, int]:
    """(major, minor) of a header; a ``minor`` that is not a count is ignored (it only
    changes what is logged), a ``version`` that is not one is damage."""
    version, minor = document.get("version"), document.get("minor", 0)
    if not isinstance(version, int) or isinstance(version, bool):
        raise ValueError(f"format version {version!r:.20}, this driver reads {versions_read()}")
    if not isinstance(minor, int) or isinstance(minor, bool) or minor < 0:
        minor = 0
    return version, minor


def record_of(line: bytes) -> dict[str, Any]:
    """One change line, checked on its own: JSON, its checksum, its shape."""
    try:
        entry = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    record = entry.get("record") if isinstance(entry, dict) else None
    if not isinstance(record, dict):
        raise ValueError("no record")
    if entry.get("checksum") != checksum(canonical(record)):
        raise ValueError("checksum mismatch")
    put, remove = record.get("put"), record.get("remove")
    if not isinstance(record.get("seq"), int):
        raise ValueError("no sequence number")
    if not isinstance(put, dict) or not all(isinstance(v, dict) for v in put.values()):
        raise ValueError("'put' is not an object of objects")
    if not isinstance(remove, list) or not all(isinstance(u, str) for u in remove):
        raise ValueError("'remove' is not a list of UIDs")
    return record


def apply_record(claims: dict[str, PreparedClaim], record: dict[str, Any]) -> None:
    for uid in record["remove"]:
        claims.pop(uid, None)
    for uid, data in record["put"].items():
        claims[uid] = PreparedClaim.from_json(uid, data)
