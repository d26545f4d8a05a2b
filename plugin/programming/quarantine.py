"""Devices a failed or interrupted load left in an unknown state: Unhealthy until shown sound.

A partial reconfiguration or an ``xbutil program`` that fails half-way can leave a region
holding part of a bitstream, or nothing; what discovery reads afterwards (the old AFU ID
still in ``afu_id``, say) does not prove the logic behind it works. So such a device is
reported Unhealthy, to the scheduler (taint) and the kubelet (health stream) alike, with the
failure as its reason, and the function it seems to hold is not trusted (the next claim
naming a function loads it again), until:

* a later load onto it succeeds (an admin's claim that tolerates the taint, say), or
* discovery stops listing it: the kernel removed the device (driver unbound, PCI removal,
  a reboot), and when it comes back it is enumerated afresh.

Only failures that may have touched the card count (a tool that is missing, or an image
refused before loading, leaves the device as it was). The set is kept in the cards'
records in the driver's state directory (:mod:`.card_state`), which the process running
each load writes too, so it survives a restart, a rolling update and a driver that died
while its loader went on. When this instance takes the driver's socket
(:meth:`Quarantine.take_ownership`) it reads every record again, and a record whose load
never recorded its end (an intent) quarantines its device:

* its card lock free: the process died mid-load, "state unknown after a load was
  interrupted" (and the record says so from then on);
* its card lock held: another process's load is still under way (the old instance of a
  roll, a loader that outlived its driver): the device is Unhealthy until that load ends,
  then the record is read again, a thread waiting for the lock meanwhile.

The single file of earlier releases (``programming-quarantine.json``) is read once and
moved into the cards' records, then removed, as soon as discovery tells each device's card.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from plugin.process import metrics
from plugin.programming.card_state import (
    FAILED_PREFIX,
    CardFiles,
    CardRecord,
    card_of,
    failed_reason,
)
from value_types.devices import Device, DeviceSet, Health

log = logging.getLogger(__name__)

FILE_NAME = "programming-quarantine.json"
"""The single file of earlier releases, migrated into the cards' records."""
REASON_PREFIX = FAILED_PREFIX
"""How a failed load's health reason starts, for the health code (``load-failed``)."""


class Quarantine:
    """Device ID -> why its state is unknown; ``changed`` is told after every change."""

    def __init__(self, state_dir: Path | None, changed: Callable[[], None] = lambda: None
                 ) -> None:
        self.state_dir = state_dir
        self.files = None if state_dir is None else CardFiles(state_dir)
        self._changed = changed
        self.reasons: dict[str, str] = {}
        self._cards: dict[str, str] = {}
        """Device ID -> its card, from the records and from discovery."""
        self._legacy: dict[str, str] = {}
        """Entries of the single file of earlier releases not yet moved into a record."""
        self._discovered = False
        """Whether discovery told each device's card yet (:meth:`apply`)."""
        self._watching: set[str] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.owned = False
        """True once this instance holds the driver's socket: only then does it write."""
        self._read_all()

    def take_ownership(self) -> None:
        """This instance holds the socket now (a rolling update's newcomer takes over):
        the records, which other processes kept until now, are the truth."""
        self.owned = True
        with contextlib.suppress(RuntimeError):
            self._loop = asyncio.get_running_loop()
        before = dict(self.reasons)
        self._read_all()
        self._migrate()
        if self.reasons != before:
            self._changed()

    def holds(self, device_id: str) -> bool:
        """Whether ``device_id``'s state is unknown: the function it seems to hold is not
        trusted."""
        return device_id in self.reasons

    def add(self, device: Device, reason: str) -> None:
        text = failed_reason(reason)
        self._cards[device.id] = card_of(device)
        if self.reasons.get(device.id) == text:
            return
        self.reasons[device.id] = text
        log.warning("device %s is Unhealthy: %s", device.id, text)
        self._write(device.id, text)
        self._tell()

    def clear(self, device: Device) -> None:
        if self.reasons.pop(device.id, None) is not None:
            log.info("device %s: a load succeeded; its state is known again", device.id)
            self._write(device.id, None)
            self._tell()

    def apply(self, devices: DeviceSet) -> DeviceSet:
        """``devices`` with every quarantined one Unhealthy; IDs discovery no longer lists
        are forgotten (the device was removed, and comes back enumerated afresh)."""
        for device in devices:
            self._cards[device.id] = card_of(device)
        self._discovered = True
        self._migrate()
        gone = [device_id for device_id in self.reasons if device_id not in devices]
        for device_id in gone:
            log.info("device %s is gone from the node; its failed load is forgotten", device_id)
            del self.reasons[device_id]
            self._write(device_id, None)
        if gone:
            metrics.devices_load_failed(len(self.reasons))
        if not self.reasons:
            return devices
        return DeviceSet.of(_marked(device, self.reasons.get(device.id)) for device in devices)

    # -- reading the records ------------------------------------------------------------

    def _read_all(self) -> None:
        if self.files is None:
            return
        found: dict[str, str] = {}
        for record in self.files.records():
            found.update(self._from_record(record))
        self._legacy = _read_legacy(self.state_dir) if self.state_dir else {}
        for device_id, reason in self._legacy.items():
            found.setdefault(device_id, reason)
        if found and found != self.reasons:
            log.warning("devices Unhealthy since a failed load (or one cut off): %s",
                        ", ".join(sorted(found)))
        self.reasons = found
        metrics.devices_load_failed(len(found))

    def _from_record(self, record: CardRecord) -> dict[str, str]:
        """The reasons ``record`` gives its devices; an intent is judged by its lock."""
        assert self.files is not None
        for device_id in record.devices():
            self._cards[device_id] = record.card
        found = dict(record.quarantined)
        intent = record.intent
        if intent is None:
            return found
        try:
            lock = self.files.try_lock(record.card)
        except OSError as exc:
            log.error("cannot examine the card lock of %s (%s)", record.card, exc.strerror)
            lock = None
        if lock is None:
            found[intent.device] = intent.under_way()
            if self.owned:
                self._watch(record.card)
            return found
        with lock:  # no load can start meanwhile: the record is ours to mend
            found[intent.device] = intent.interrupted()
            log.warning("device %s: %s", intent.device, found[intent.device])
            if self.owned:
                self._update(record.card, lambda r: _interrupted(r, intent.device,
                                                                 found[intent.device]))
        return found

    def _watch(self, card: str) -> None:
        """Read the card's record again once the load holding it ends (a thread waits)."""
        if card in self._watching or self.files is None or self._loop is None:
            return
        self._watching.add(card)
        files, loop = self.files, self._loop

        def wait() -> None:
            try:
                files.wait_free(card)
            except OSError as exc:
                log.error("cannot wait for the card lock of %s (%s)", card, exc.strerror)
                return
            with contextlib.suppress(RuntimeError):  # the loop closed: the process ends
                loop.call_soon_threadsafe(self._read_card, card)

        log.info("card %s: another process is loading it; its devices are Unhealthy until "
                 "that load ends", card)
        threading.Thread(target=wait, name=f"card lock {card}", daemon=True).start()

    def _read_card(self, card: str) -> None:
        """The load that held ``card`` ended: its record says what it left."""
        assert self.files is not None
        self._watching.discard(card)
        try:
            record = self.files.read(card)
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            log.error("cannot read the record of %s (%s); its devices stay Unhealthy",
                      card, exc)
            return
        before = dict(self.reasons)
        for device_id in [d for d, c in self._cards.items() if c == card]:
            self.reasons.pop(device_id, None)
        self.reasons.update(self._from_record(record))
        if self.reasons != before:
            log.info("card %s: the other process's load ended; Unhealthy now: %s", card,
                     ", ".join(sorted(d for d in self.reasons if self._cards.get(d) == card))
                     or "none")
            self._tell()

    # -- writing ------------------------------------------------------------------------

    def _write(self, device_id: str, reason: str | None) -> None:
        """Put ``device_id``'s reason (None: none) in its card's record."""
        card = self._cards.get(device_id)
        if card is None:
            return

        def change(record: CardRecord) -> None:
            if reason is None:
                record.quarantined.pop(device_id, None)
            else:
                record.quarantined[device_id] = reason

        self._update(card, change)

    def _update(self, card: str, change: Callable[[CardRecord], None]) -> None:
        if self.files is None or not self.owned:
            return
        try:
            self.files.update(card, change)
        except OSError as exc:
            log.error("cannot write %s (%s); a restart would forget which devices a failed "
                      "load left unknown", self.files.record_path(card), exc.strerror)

    def _migrate(self) -> None:
        """Move the single file of earlier releases into the cards' records, once this
        instance owns them and discovery told each device's card (a device it no longer
        lists is forgotten, as :meth:`apply` forgets it); then remove the file."""
        if not self._legacy or not self.owned or not self._discovered or \
                self.state_dir is None:
            return
        for device_id, reason in self._legacy.items():
            if device_id in self._cards:
                self._write(device_id, self.reasons.get(device_id, reason))
        try:
            (self.state_dir / FILE_NAME).unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.error("cannot remove %s (%s); its entries are in the cards' records now",
                      self.state_dir / FILE_NAME, exc.strerror)
        log.info("moved %d quarantined device(s) from %s into the cards' records",
                 len(self._legacy), FILE_NAME)
        self._legacy = {}

    def _tell(self) -> None:
        metrics.devices_load_failed(len(self.reasons))
        self._changed()


def _interrupted(record: CardRecord, device_id: str, reason: str) -> None:
    record.intent = None
    record.quarantined[device_id] = reason


def _read_legacy(state_dir: Path) -> dict[str, str]:
    path = state_dir / FILE_NAME
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.error("%s cannot be read (%s); devices whose last load failed may be "
                  "reported Healthy", path, exc)
        return {}
    if not isinstance(data, dict) or not isinstance(data.get("devices"), dict):
        log.error("%s holds no device list; devices whose last load failed may be "
                  "reported Healthy", path)
        return {}
    return {str(k): str(v) for k, v in data["devices"].items()}


def _marked(device: Device, reason: str | None) -> Device:
    if reason is None:
        return device
    joined = reason if device.healthy else f"{device.health_reason}; {reason}"
    return replace(device, health=Health.UNHEALTHY, health_reason=joined)
