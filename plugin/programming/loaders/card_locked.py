"""Every load run on this node under its card's lock, with a record of it before it starts.

:func:`plugin.programming.setup.loaders_for` wraps each loader that loads (in ``serve``
without a loader process, and in the ``loader`` process) in a :class:`CardLockedLoader`, so
whichever process runs a load, and however many run side by side (a rolling update's two
pods, a loader that outlives its driver), one card is programmed by one of them at a time
(:mod:`plugin.programming.card_state`). For each load, that process:

1. takes the card lock, polling (without blocking the event loop, in ``serve``; in its
   connection's thread, in the ``loader`` process); the wait counts against
   the job's timeout, and a job whose budget runs out waiting fails untouched
   (``touched=False``), naming the load it waited for;
2. writes the card's intent record, before the card is touched (a record it cannot write
   refuses the load, untouched: a crash must leave a trace);
3. runs the load, the lock handed to the vendor tool it starts
   (:data:`~plugin.programming.loaders.tools.HELD_FDS`);
4. records the outcome itself, so it is recorded even when the driver that asked is gone:
   the intent removed, and where the card may have been touched (a failure that says so, or
   the load cut off), the device quarantined in the card's record instead.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import replace

from plugin.programming.card_state import (
    CardBusy,
    CardFiles,
    CardLock,
    CardRecord,
    Intent,
    card_of,
    failed_reason,
)
from plugin.programming.load_record import now
from plugin.programming.loaders.base import LoadFailed, LoadJob, LocalLoader
from plugin.programming.loaders.tools import HELD_FDS
from value_types.devices import Device

log = logging.getLogger(__name__)

LOCK_STEP = "card lock"


class CardLockedLoader:
    """``inner``, each load under its card's lock and recorded in ``files``: :meth:`load`
    for the ``serve`` path (the lock awaited, ``inner.load``), :meth:`load_blocking` for
    the ``loader`` process (the lock waited for in its thread, ``inner.load_blocking``);
    both take the same steps (:meth:`_recorded`)."""

    def __init__(self, inner: LocalLoader, files: CardFiles) -> None:
        self.inner = inner
        self.files = files
        self.name = inner.name
        self.family = inner.family

    def unavailable(self, device: Device) -> str | None:
        return self.inner.unavailable(device)

    async def loaded(self, device: Device) -> str | None:
        return await self.inner.loaded(device)

    def loaded_blocking(self, device: Device) -> str | None:
        return self.inner.loaded_blocking(device)

    async def load(self, job: LoadJob) -> None:
        deadline = time.monotonic() + job.timeout
        card = card_of(job.device)
        try:
            lock = await self.files.lock(card, deadline)
        except (CardBusy, OSError) as exc:
            raise self._not_locked(card, job, exc) from None
        with self._recorded(job, card, lock, deadline) as timed:
            await self.inner.load(timed)

    def load_blocking(self, job: LoadJob) -> None:
        deadline = time.monotonic() + job.timeout
        card = card_of(job.device)
        try:
            lock = self.files.lock_blocking(card, deadline)
        except (CardBusy, OSError) as exc:
            raise self._not_locked(card, job, exc) from None
        with self._recorded(job, card, lock, deadline) as timed:
            self.inner.load_blocking(timed)

    def _not_locked(self, card: str, job: LoadJob, exc: CardBusy | OSError) -> LoadFailed:
        if isinstance(exc, CardBusy):
            return LoadFailed(LOCK_STEP, f"the card {card} was not free within "
                                         f"{job.timeout:g} s: {exc.holder}; nothing was "
                                         "loaded", touched=False)
        return LoadFailed(LOCK_STEP, self._cannot(card, exc), touched=False)

    @contextlib.contextmanager
    def _recorded(self, job: LoadJob, card: str, lock: CardLock,
                  deadline: float) -> Iterator[LoadJob]:
        """With ``lock`` held: the intent written, the lock handed to the tools started
        (:data:`HELD_FDS`), the job with what is left of its budget to load; then the
        outcome recorded, whichever way the load ended."""
        with lock:
            intent = Intent(job.device.id, job.function_id, job.image, os.getpid(), now())
            try:
                self.files.update(card, lambda record: _begin(record, intent))
            except OSError as exc:
                raise LoadFailed(LOCK_STEP, self._cannot(card, exc), touched=False) from None
            held = HELD_FDS.set((lock.fd,))
            try:
                yield replace(job, timeout=max(deadline - time.monotonic(), 0.1))
            except LoadFailed as failure:
                self._ended(card, job, failed_reason(
                    f"loading {job.function_id} with {self.name} failed at {failure.step}: "
                    f"{failure.detail}") if failure.touched else None)
                raise
            except BaseException:
                self._ended(card, job, intent.interrupted())
                raise
            finally:
                HELD_FDS.reset(held)
            self._ended(card, job, None)

    def _ended(self, card: str, job: LoadJob, quarantined: str | None) -> None:
        """The load's outcome, in the card's record: the intent gone, the device
        quarantined where the card may have been touched. A record that cannot be written
        keeps the intent: the next start then quarantines the device (fail safe)."""
        def end(record: CardRecord) -> None:
            record.intent = None
            if quarantined is not None:
                record.quarantined[job.device.id] = quarantined

        try:
            self.files.update(card, end)
        except OSError as exc:
            log.error("cannot record the end of the load onto %s in %s (%s); the device "
                      "will be taken as interrupted at the next start", job.device.id,
                      self.files.record_path(card), exc.strerror)

    def _cannot(self, card: str, exc: OSError) -> str:
        return (f"cannot take the card lock or write the record of {card} in "
                f"{self.files.directory} ({exc.strerror or exc}); nothing was loaded (every "
                "process that may program this card must share that directory: "
                "--dra-state-dir)")


def _begin(record: CardRecord, intent: Intent) -> None:
    record.intent = intent
