"""Every load run on this node under its card's lock, with a record of it before it starts.

:func:`plugin.programming.setup.loaders_for` wraps each loader that loads (in ``serve``
without a loader process, and in the ``loader`` process) in a :class:`CardLockedLoader`, so
whichever process runs a load, and however many run side by side (a rolling update's two
pods, a loader that outlives its driver), one card is programmed by one of them at a time
(:mod:`plugin.programming.card_state`). For each load, that process:

1. takes the card lock, polling without blocking the event loop; the wait counts against
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

import logging
import os
import time
from dataclasses import replace

from plugin.programming.card_state import (
    CardBusy,
    CardFiles,
    CardRecord,
    Intent,
    card_of,
    failed_reason,
)
from plugin.programming.load_record import now
from plugin.programming.loaders.base import Loader, LoadFailed, LoadJob
from plugin.programming.loaders.tools import HELD_FDS
from value_types.devices import Device

log = logging.getLogger(__name__)

LOCK_STEP = "card lock"


class CardLockedLoader:
    """``inner``, each load under its card's lock and recorded in ``files``."""

    def __init__(self, inner: Loader, files: CardFiles) -> None:
        self.inner = inner
        self.files = files
        self.name = inner.name
        self.family = inner.family

    def unavailable(self, device: Device) -> str | None:
        return self.inner.unavailable(device)

    async def loaded(self, device: Device) -> str | None:
        return await self.inner.loaded(device)

    async def load(self, job: LoadJob) -> None:
        deadline = time.monotonic() + job.timeout
        card = card_of(job.device)
        try:
            lock = await self.files.lock(card, deadline)
        except CardBusy as busy:
            raise LoadFailed(LOCK_STEP, f"the card {card} was not free within "
                                        f"{job.timeout:g} s: {busy.holder}; nothing was "
                                        "loaded", touched=False) from None
        except OSError as exc:
            raise LoadFailed(LOCK_STEP, self._cannot(card, exc), touched=False) from None
        with lock:
            intent = Intent(job.device.id, job.function_id, job.image, os.getpid(), now())
            try:
                self.files.update(card, lambda record: _begin(record, intent))
            except OSError as exc:
                raise LoadFailed(LOCK_STEP, self._cannot(card, exc), touched=False) from None
            held = HELD_FDS.set((lock.fd,))
            try:
                remaining = max(deadline - time.monotonic(), 0.1)
                await self.inner.load(replace(job, timeout=remaining))
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
