"""What every process that may program a card on this node shares of it: a lock and a record.

Two processes can hold a loader for the same card: the outgoing and the incoming instance of
a rolling update (each pod with its own loader), or a ``loader`` process that goes on
loading after the driver that asked died and came back. An ``asyncio.Lock`` keeps loads
apart in one process only; these files keep them apart on the node. They live in the
driver's state directory on the host (``<state-dir>/cards/``), which every instance and
every loader of the driver mounts at the same place:

* ``<card>.lock``: ``flock(2)`` on it, exclusive, is held for each load and clear by the
  process that runs the loader, and handed to the vendor tool it starts (the descriptor is
  passed down), so a killed parent does not free a card its tool still writes. The kernel
  drops it when the last holder exits, however it exits. Lock files are never removed: a
  file unlinked while someone waits on it would let a third process lock a new one.
* ``<card>.json``: the card's record, replaced whole (:func:`replace_atomically`): the
  *intent* of the load under way, written under the card lock before the card is touched
  and removed once its outcome is recorded, and the devices of the card a failed or
  interrupted load left in an unknown state, with why. A record that outlives its load's
  process (an intent whose lock is free) means the load was cut off: the card's state is
  unknown. Edits to records are serialised by a short lock of their own (``.records.lock``),
  held only for a read and a write, never across a load.

``<card>`` is the key one load at a time is kept on: the FME node (an FME serves several
ports), else the PCI address, else the device ID, made safe as a file name.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from plugin.process.files import replace_atomically
from value_types.devices import Device

log = logging.getLogger(__name__)

CARDS_DIR = "cards"
RECORDS_LOCK = ".records.lock"
POLL_FIRST = 0.02
POLL_MAX = 0.25
"""Seconds between two tries of a busy card lock: first, and at most (doubling between)."""
FAILED_PREFIX = "load failed"
INTERRUPTED_PREFIX = "load interrupted"
UNDER_WAY_PREFIX = "image being loaded by another process"
UNTIL = "its state is unknown until a load succeeds"

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def card_of(device: Device) -> str:
    """The card ``device`` is part of, as far as loading goes: one load at a time per key."""
    return device.attribute("fme_node") or device.attribute("pci_address") or device.id


def file_stem(card: str) -> str:
    """``card`` as a file name: ``/dev/dfl-fme.0`` -> ``_dev_dfl-fme.0``."""
    return _UNSAFE.sub("_", card).lstrip(".") or "_"


def failed_reason(detail: str) -> str:
    """The health reason of a device a failed load may have touched."""
    return f"{FAILED_PREFIX}: {detail}; {UNTIL}"


@dataclass(frozen=True)
class Intent:
    """A load about to touch the card: which device, what, since when, by which process."""

    device: str
    function: str
    image: str | None
    pid: int
    started: str

    def shown(self) -> str:
        return (f"loading {self.function} ({self.image or 'by ID'}) onto {self.device}, "
                f"begun {self.started} by process {self.pid}")

    def interrupted(self) -> str:
        """The health reason of its device once the load is known to be cut off."""
        return (f"{INTERRUPTED_PREFIX}: state unknown after a load was interrupted "
                f"({self.shown()}); {UNTIL}")

    def under_way(self) -> str:
        """The health reason of its device while another process still holds the card."""
        return (f"{UNDER_WAY_PREFIX} ({self.shown()}); its state is unknown until that "
                "load ends")


@dataclass
class CardRecord:
    """One card's record: the load under way, and the devices left in an unknown state."""

    card: str
    intent: Intent | None = None
    quarantined: dict[str, str] = field(default_factory=dict)

    def devices(self) -> set[str]:
        """Every device the record speaks for."""
        return set(self.quarantined) | ({self.intent.device} if self.intent else set())


class CardLock:
    """A held card lock: the open descriptor ``flock`` was taken on. Released by closing
    it (never ``LOCK_UN``, which would free it for a tool that still holds a copy)."""

    def __init__(self, fd: int, path: Path) -> None:
        self.fd = fd
        self.path = path

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> CardLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class CardBusy(Exception):
    """The card lock was not free before the deadline; ``holder`` says whose load it was."""

    def __init__(self, holder: str) -> None:
        super().__init__(holder)
        self.holder = holder


class CardFiles:
    """The card locks and records in ``<state_dir>/cards``; building it touches nothing."""

    def __init__(self, state_dir: Path) -> None:
        self.directory = Path(state_dir) / CARDS_DIR

    def lock_path(self, card: str) -> Path:
        return self.directory / f"{file_stem(card)}.lock"

    def record_path(self, card: str) -> Path:
        return self.directory / f"{file_stem(card)}.json"

    # -- the card lock ------------------------------------------------------------------

    def _open(self, path: Path) -> int:
        self.directory.mkdir(parents=True, exist_ok=True)
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def try_lock(self, card: str) -> CardLock | None:
        """The card lock if it is free now, else None (never waits)."""
        path = self.lock_path(card)
        fd = self._open(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        return CardLock(fd, path)

    def _attempt(self, card: str, deadline: float) -> CardLock | float:
        """The card lock if it is free now, else the seconds left before ``deadline``
        (``time.monotonic``); :class:`CardBusy` naming the holder's load past it."""
        held = self.try_lock(card)
        if held is not None:
            return held
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise CardBusy(self.holder(card))
        return remaining

    async def lock(self, card: str, deadline: float) -> CardLock:
        """The card lock, waited for without blocking the event loop until ``deadline``
        (``time.monotonic``); :class:`CardBusy` naming the holder's load past it."""
        import asyncio  # here: the loader process, which waits with lock_blocking, never holds it

        delay = POLL_FIRST
        while not isinstance(got := self._attempt(card, deadline), CardLock):
            await asyncio.sleep(min(delay, got))
            delay = min(delay * 2, POLL_MAX)
        return got

    def lock_blocking(self, card: str, deadline: float) -> CardLock:
        """:meth:`lock`, waited for in the calling thread."""
        delay = POLL_FIRST
        while not isinstance(got := self._attempt(card, deadline), CardLock):
            time.sleep(min(delay, got))
            delay = min(delay * 2, POLL_MAX)
        return got

    def wait_free(self, card: str) -> None:
        """Block until the card lock is free (taken and given back at once): for a thread
        that waits for another process's load to end."""
        fd = self._open(self.lock_path(card))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        finally:
            os.close(fd)

    def holder(self, card: str) -> str:
        """Whose load holds the card, as its record says."""
        intent = self.read(card).intent
        if intent is None:
            return f"another process holds the card lock {self.lock_path(card)}"
        return f"another process's load holds the card ({intent.shown()})"

    # -- records ------------------------------------------------------------------------

    def read(self, card: str) -> CardRecord:
        """The card's record; empty where there is none. OSError/ValueError: unreadable."""
        record = _read_record(self.record_path(card))
        return record if record is not None else CardRecord(card)

    def records(self) -> list[CardRecord]:
        """Every card's record; one that cannot be read is logged and skipped."""
        if not self.directory.is_dir():
            return []
        found = []
        for path in sorted(self.directory.glob("*.json")):
            try:
                record = _read_record(path)
            except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
                log.error("%s cannot be read (%s); the devices of that card whose last load "
                          "failed or was interrupted may be reported Healthy", path, exc)
                continue
            if record is not None:
                found.append(record)
        return found

    def update(self, card: str, change: Callable[[CardRecord], None]) -> CardRecord:
        """Apply ``change`` to the card's record as it is now and write it back whole
        (removed once it says nothing), under the records' lock. OSError if it cannot."""
        with self._records_locked():
            path = self.record_path(card)
            try:
                record = self.read(card)
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                log.error("%s cannot be read (%s); it is written anew", path, exc)
                record = CardRecord(card)
            change(record)
            if record.intent is None and not record.quarantined:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            else:
                replace_atomically(path, json.dumps(_encoded(record), sort_keys=True))
            return record

    @contextlib.contextmanager
    def _records_locked(self) -> Iterator[None]:
        fd = self._open(self.directory / RECORDS_LOCK)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


def _encoded(record: CardRecord) -> dict[str, object]:
    return {"card": record.card, "intent": asdict(record.intent) if record.intent else None,
            "quarantined": dict(sorted(record.quarantined.items()))}


def _read_record(path: Path) -> CardRecord | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    intent = data.get("intent")
    quarantined = data.get("quarantined") or {}
    if not isinstance(data["card"], str) or not isinstance(quarantined, dict):
        raise ValueError("not a card record")
    return CardRecord(data["card"], Intent(**intent) if intent else None,
                      {str(k): str(v) for k, v in quarantined.items()})
