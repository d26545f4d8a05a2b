"""Making a prepared device hold the function its claim needs: skip, or load, never guess.

For each device of a claim whose configuration names a function (:mod:`.function_config`),
called by NodePrepareResources before the claim is answered, so no container starts on a
device that does not hold its function yet:

1. a load going on on the device (another claim's, a clear) is waited for first: what the
   device holds is only read once nothing is changing it;
2. the image must hold that function and fit the device (:mod:`.image_checks`), on every
   path, so a wrong configuration fails alike on every node;
3. a device that already holds the function is left alone: the common, fast path;
4. otherwise the device must be programmable here (``--programming on`` and a loader whose
   tool or FME node is there) and no other claim may hold it (a prepared one, or one being
   prepared now, with or without a function of its own: its container may be using the
   device); then, one load at a time per card (an FME serves several ports, and
   ``xbutil``/the AWS SDK take the whole card or slot), the loader loads the image, a rescan
   is asked for, and the claim is answered only once discovery reads the new function from
   the device, within ``timeout`` seconds from when the card was free;
5. a load that failed, or that the device never reported, is that claim's error naming the
   step and the kernel's or tool's message; if the card may have been touched, the device
   is quarantined (:mod:`.quarantine`: Unhealthy until a later load succeeds). A load is
   never cut off half-way: it outlives a kubelet call that gave up, and stopping waits for
   it; one cut off all the same (the process killed) leaves its intent record, and the next
   start quarantines the device (:mod:`.card_state`), whose function is then not trusted.

Programming happens only here, so only for claims this driver prepares for this node's pool.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping

from plugin.model.programming import OFF
from plugin.process import metrics
from plugin.programming.card_state import card_of
from plugin.programming.clears import Clears
from plugin.programming.digest import DIGEST_STEP
from plugin.programming.function_config import FunctionSpec, function_shown
from plugin.programming.image_checks import DESCRIBED_ONLY, ImageChecks, held_function
from plugin.programming.load_record import LoadRecord, LoadRecords, now
from plugin.programming.loaders.base import Loader, LoadFailed, LoadJob
from plugin.programming.outcome import LOADED, SKIPPED, Outcome
from plugin.programming.quarantine import Quarantine
from plugin.programming.vetting import (
    DIGEST_MISMATCH,
    FAILED,
    REFUSED,
    ProgrammingRefused,
    Vetting,
)
from value_types.devices import Device, DeviceSet

__all__ = ["DIGEST_MISMATCH", "FAILED", "LOADED", "REFUSED", "SKIPPED", "Programmer",
           "ProgrammingRefused", "unavailable"]

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 120.0
REPORT_GRACE = 5.0
"""Seconds the device has to report its new function once the loader returned, even when
the load itself took nearly all of the timeout (a rescan must land first)."""
def unavailable(device: Device, enabled: bool, loaders: Mapping[str, Loader]) -> str | None:
    """Why ``device`` cannot be given another function on this node, or None: programming
    must be on, and its family's loader must find its way in (tool, FME node)."""
    if not enabled:
        return OFF
    loader = loaders.get(device.backend)
    if loader is None:
        return f"no loader programs {device.backend} devices"
    return loader.unavailable(device)


Told = Callable[[str, str, str, str], None]
"""``(device_id, claim, kind, message)`` for Events: kind ``FunctionLoaded`` or
``FunctionLoadFailed``."""


class Programmer:
    """Gives devices the functions their claims need (see the module docstring)."""

    def __init__(self, *, enabled: bool, loaders: Mapping[str, Loader],
                 checks: ImageChecks | None, quarantine: Quarantine,
                 devices: Callable[[], DeviceSet], rescan: Callable[[str], None],
                 driver: str, timeout: float = DEFAULT_TIMEOUT,
                 told: Told | None = None, require_digest: bool = False,
                 records: LoadRecords | None = None) -> None:
        self.enabled = enabled
        self.vetting = Vetting(checks, driver, require_digest)
        self.records = records or LoadRecords(None)
        """What was loaded onto each device, from which bytes, for ``discover``."""
        self.loaders = dict(loaders)
        self.on_loaders_changed: Callable[[], None] = lambda: None
        """Called (from any thread) when :meth:`generation` changes."""
        self.on_changed: Callable[[], None] = lambda: None
        """Called (on the event loop) when a load or a clear ends: :meth:`changing` no
        longer names its device."""
        for loader in self.loaders.values():
            watch = getattr(loader, "watch", None)
            if watch is not None:
                watch(self._loaders_changed)
        self.checks = checks
        self.quarantine = quarantine
        self.timeout = timeout
        self.driver = driver
        self._devices = devices
        self._rescan = rescan
        self._told = told
        self.clears = Clears(self.ensure, self.records.path.parent if self.records.path
                             else None, lambda: self.on_changed())
        """The clears unprepares ask for (:mod:`.clears`): recorded, run, resumed."""
        self._locks: dict[str, asyncio.Lock] = {}
        self._changed = asyncio.Event()
        self._loading: dict[str, asyncio.Task[Outcome]] = {}
        """Device ID -> the load going on now (it outlives a call the kubelet gave up)."""
        self._loaded_for: dict[str, tuple[str, str]] = {}
        """Device ID -> (claim UID, function ID) of the last load started on it."""
        self.waiting: dict[str, str] = {}
        """Claim UID -> the load it waits for now, for a kubelet call that times out."""
        self._claimed: dict[str, Counter[str]] = {}
        """Device ID -> UIDs of claims being prepared on it now (not yet recorded), counted:
        the kubelet may call again for a claim while its first call is still going."""

    # -- what the inventory and discover say ------------------------------------------

    def unavailable(self, device: Device) -> str | None:
        """Why ``device`` cannot be given another function on this node, or None."""
        return unavailable(device, self.enabled, self.loaders)

    def programmable(self, device: Device) -> bool:
        return self.unavailable(device) is None

    def generation(self) -> tuple[int, ...]:
        """Changes whenever a loader's own word on which devices it can program changes
        (a loader process's inventory): a cache of ``programmable`` keys on it."""
        return tuple(getattr(loader, "generation", 0) for loader in self.loaders.values())

    def _loaders_changed(self) -> None:
        """A loader's word changed (told from its own thread)."""
        self.on_loaders_changed()

    # -- the device feed and the socket -------------------------------------------------

    def devices_changed(self) -> None:
        """Discovery published a new device set (a load may show in it)."""
        self._changed.set()

    def take_ownership(self) -> None:
        """This instance holds the driver's socket: what every process recorded of the
        cards (failed loads, loads cut off or still run by another process) is read again,
        and from now on this one writes it."""
        self.quarantine.take_ownership()

    # -- claims -------------------------------------------------------------------------

    def claim_started(self, uid: str, device_ids: Iterable[str]) -> None:
        """Claim ``uid`` is being prepared on these devices: no load for anyone else starts
        on them until it is recorded or refused (:meth:`claim_finished`)."""
        for device_id in device_ids:
            self._claimed.setdefault(device_id, Counter())[uid] += 1

    def preparing(self) -> frozenset[str]:
        """Devices claims are being prepared on now (not yet recorded, or refused)."""
        return frozenset(self._claimed)

    def changing(self) -> frozenset[str]:
        """Devices a load or a clear is changing now, a clear counting from the unprepare
        that asks for it (before its load starts): what they hold is about to change, so
        they are offered to no new share meanwhile (:mod:`plugin.serving.dra.sharing`)."""
        loading = {d for d, task in self._loading.items() if not task.done()}
        return frozenset(loading | self.clears.changing())

    def claim_finished(self, uid: str, device_ids: Iterable[str] | None = None) -> None:
        """The preparation of claim ``uid`` started on ``device_ids`` (None: all) is over,
        recorded or refused; another one of the claim still going keeps its devices."""
        for device_id in list(self._claimed if device_ids is None else device_ids):
            uids = self._claimed.get(device_id, Counter())
            uids[uid] -= 1
            if uids[uid] <= 0:
                uids.pop(uid, None)
            if not uids:
                self._claimed.pop(device_id, None)

    def configuration_refused(self, device_ids: Iterable[str]) -> None:
        """A claim's configuration could not be read: each of its devices counts as refused."""
        devices = self._devices()
        for device_id in device_ids:
            device = devices.get(device_id)
            metrics.dra_programming(self.driver, device.backend if device else "", "",
                                    REFUSED, 0.0)

    async def settled(self, device_ids: Iterable[str]) -> None:
        """Once no load is going on on any of ``device_ids`` (a claim naming no function
        must not be answered while a clear is changing its device)."""
        for device_id in device_ids:
            loading = self._loading.get(device_id)
            if loading is not None and not loading.done():
                await asyncio.wait([loading])

    async def held_now(self, device_id: str) -> str | None:
        """The function ``device_id`` holds once no load is changing it (None: the device
        is gone, or discovery cannot tell): what a share of it must need, since a share
        never programs."""
        return (await self.held_or_why(device_id))[0]

    async def held_or_why(self, device_id: str) -> tuple[str | None, str]:
        """:meth:`held_now`, and why it cannot be read ("" when it can: None is then
        nothing), so a guard can fail closed on a slot whose describe fails."""
        await self.settled([device_id])
        device = self._devices().get(device_id)
        return (None, "") if device is None else await self._read_held(device)

    def unprepared(self, uid: str, outcomes: Iterable[Outcome],
                   holders: Callable[[str], list[str]]) -> None:
        """Claim ``uid`` (whose devices got ``outcomes``) is unprepared: the function its
        DeviceClass clears each device to is recorded pending, then loaded after the
        kubelet's answer, unless another claim holds the device by then (the preparer
        records before the checkpoint entry goes: :mod:`.clears`)."""
        asked = self.clears.asked(uid, outcomes)
        self.clears.record(asked)
        self.clears.start(asked, holders)

    async def close(self, timeout: float | None = None) -> None:
        """Wait for loads under way, clears and loads of calls the kubelet gave up alike:
        a load is never cut off half-way while there is time. After ``timeout`` seconds
        (the pod's grace period running out) what is left is cut off: a load that may
        have started leaves its device quarantined, a clear stays pending for the next
        instance."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while busy := [*self.clears.running(),
                       *(t for t in self._loading.values() if not t.done())]:
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                log.error("stopping: %d load(s) and clear(s) still under way after %g s; "
                          "cutting them off", len(busy), timeout)
                for task in busy:
                    task.cancel()
                await asyncio.gather(*busy, return_exceptions=True)
                return
            await asyncio.wait(busy, timeout=left)

    # -- giving a device its function ---------------------------------------------------

    async def check(self, device_id: str, spec: FunctionSpec) -> None:
        """Everything :meth:`ensure` would refuse before a load, for every device of a claim
        before any is loaded: a claim refused for its second device must not have changed
        its first card for nothing."""
        await self.settled([device_id])
        await self._needs_load(self._device(device_id), spec)

    async def _needs_load(self, device: Device, spec: FunctionSpec) -> bool:
        """Whether ``device`` must be loaded to hold ``spec``; :class:`ProgrammingRefused`
        for what no load could mend (a wrong image, a device that cannot be programmed)."""
        self.vetting.check_image(device, spec)
        await self.vetting.check_digest(device, spec)
        held = await self._held(device)
        if held == spec.function_id and not self.quarantine.holds(device.id):
            return False  # held, and trusted: a quarantined device's function is not
        why = self.unavailable(device)
        if why is not None:
            raise self.vetting.refuse(
                device, spec, f"it holds {_shown_id(spec, held)} and cannot be programmed: {why}")
        return True

    async def ensure(self, claim: str, uid: str, device_id: str, spec: FunctionSpec,
                     holders: Callable[[str], list[str]]) -> Outcome:
        """Make ``device_id`` hold ``spec`` for claim ``uid`` (``claim``: its name, for
        messages); ``holders(device_id)`` names the other prepared claims that hold the
        device. :class:`ProgrammingRefused` with the reason when it cannot."""
        began = time.monotonic()
        while True:
            # A load going on (another claim's, a clear, this claim's from a call the
            # kubelet gave up): what the device holds is read once it is over.
            loading = self._loading.get(device_id)
            if loading is not None and not loading.done():
                self.waiting[uid] = f"waiting for the load going on on {device_id}"
                try:
                    await asyncio.wait([loading])
                finally:
                    self.waiting.pop(uid, None)
                mine = self._loaded_for.get(device_id) == (uid, spec.function_id)
                if mine and not loading.cancelled() and loading.exception() is None:
                    return loading.result()  # this claim's load, from a call given up
                continue
            device = self._device(device_id)
            if not await self._needs_load(device, spec):
                metrics.dra_programming(self.driver, device.backend, "", SKIPPED,
                                        time.monotonic() - began)
                return Outcome(device_id, spec, SKIPPED)
            if self._loading.get(device_id) is None or self._loading[device_id].done():
                break
        loading = asyncio.create_task(self._locked_load(claim, uid, device_id, spec, holders),
                                      name=f"load onto {device_id}")
        loading.add_done_callback(_retrieved)
        loading.add_done_callback(lambda _done: self.on_changed())
        self._loading[device_id] = loading
        self._loaded_for[device_id] = (uid, spec.function_id)
        # Shielded: the kubelet giving up on its call must not cut a load off half-way
        # (a card left half-programmed); the load goes on, and the kubelet's next call for
        # this claim waits for it, then finds the function held.
        self.waiting[uid] = f"loading {spec.shown()} onto {device_id}"
        try:
            return await asyncio.shield(loading)
        finally:
            self.waiting.pop(uid, None)

    async def _locked_load(self, claim: str, uid: str, device_id: str, spec: FunctionSpec,
                           holders: Callable[[str], list[str]]) -> Outcome:
        async with self._lock(self._device(device_id)):
            began = time.monotonic()  # the budget counts from when the card is free
            device = self._device(device_id)  # as it is now, after any load before ours
            held = await self._held(device)
            if held == spec.function_id and not self.quarantine.holds(device.id):
                return Outcome(device_id, spec, SKIPPED)
            others = sorted(set(holders(device_id)) |
                            {u for u in self._claimed.get(device_id, ()) if u != uid})
            if others:
                raise self.vetting.refuse(
                    device, spec, f"it holds {_shown_id(spec, held)} for {len(others)} other "
                    f"claim(s) ({', '.join(others[:3])}); a device is never reprogrammed under "
                    "a claim that holds it")
            return await self._load(claim, device, spec, self.loaders[device.backend], began)

    async def _load(self, claim: str, device: Device, spec: FunctionSpec, loader: Loader,
                    began: float) -> Outcome:
        deadline = began + self.timeout
        digest = await self.vetting.digest_to_load(device, spec)
        log.info("claim %s: loading %s onto %s with %s", claim, spec.shown(), device.id,
                 loader.name)
        job = LoadJob(device, spec.function_id, self.checks.library if self.checks else None,
                      spec.image, timeout=max(deadline - time.monotonic(), 0.1),
                      sha256=digest)
        try:
            await loader.load(job)
        except LoadFailed as failure:
            if failure.step == DIGEST_STEP and not failure.touched:
                # The file changed between the check and the load: refused, untouched.
                raise self.vetting.refuse(device, spec, failure.detail,
                                          result=DIGEST_MISMATCH, sha256=digest) from None
            self._failed(claim, device, spec, loader, failure.step, failure.detail,
                         failure.touched)
            raise ProgrammingRefused(f"loading {spec.shown()} onto {device.id} failed at "
                                     f"{failure.step}: {failure.detail}", result=FAILED,
                                     device_id=device.id, sha256=digest) from None
        except BaseException:
            # Cut off all the same (the process stopping without waiting): what the card
            # holds now is not known.
            self._failed(claim, device, spec, loader, "load", "cut off before it ended",
                         True)
            raise
        self._rescan(f"{spec.function_id} loaded onto {device.id}")
        reported = await self._reported(device.id, spec.function_id,
                                        max(deadline, time.monotonic()
                                            + min(REPORT_GRACE, self.timeout)))
        if reported is not True:
            detail = (f"the device did not report it within {self.timeout:g} s "
                      f"(it reports {_shown_id(spec, reported)})")
            self._failed(claim, device, spec, loader, "waiting for the new function", detail,
                         True)
            raise ProgrammingRefused(f"loading {spec.shown()} onto {device.id}: {detail}",
                                     result=FAILED, device_id=device.id, sha256=digest)
        seconds = time.monotonic() - began
        self.quarantine.clear(device)
        outcome = Outcome(device.id, spec, LOADED, loader.name, seconds, digest)
        self.records.loaded(device.id, LoadRecord(spec.function_id, spec.shown(), spec.image,
                                                  digest, claim, now()))
        metrics.dra_programming(self.driver, device.backend, loader.name, LOADED, seconds)
        log.info("claim %s: %s", claim, outcome.message())
        if self._told is not None:
            self._told(device.id, claim, "FunctionLoaded", f"{outcome.message()} for claim "
                       f"{claim}")
        return outcome

    async def _reported(self, device_id: str, function_id: str,
                        deadline: float) -> bool | str | None:
        """True once the device reports ``function_id``; else what it reports at the
        deadline."""
        loader_reads = self._device(device_id).backend in DESCRIBED_ONLY
        while True:
            self._changed.clear()
            device = self._devices().get(device_id)
            if device is not None:
                held = await self._held(device) if loader_reads else held_function(device)
                if held == function_id:
                    return True
            else:
                held = None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return held
            try:
                async with asyncio.timeout(min(remaining, 1.0) if loader_reads else remaining):
                    await self._changed.wait()
            except TimeoutError:
                pass

    async def _held(self, device: Device) -> str | None:
        return (await self._read_held(device))[0]

    async def _read_held(self, device: Device) -> tuple[str | None, str]:
        held = held_function(device)
        if held is not None or device.backend not in DESCRIBED_ONLY:
            return held, ""
        loader = self.loaders.get(device.backend)
        if loader is None:
            return None, f"no describe of the AWS SDK is run here ({self.unavailable(device)})"
        try:
            return await loader.loaded(device), ""
        except LoadFailed as failure:
            log.warning("cannot tell which function %s holds: %s", device.id, failure)
            return None, str(failure)

    def _device(self, device_id: str) -> Device:
        device = self._devices().get(device_id)
        if device is None:
            raise ProgrammingRefused(f"device {device_id} is no longer on this node")
        return device

    def _lock(self, device: Device) -> asyncio.Lock:
        """This process's turn; the loader's process locks the card on the node too."""
        return self._locks.setdefault(card_of(device), asyncio.Lock())

    def _failed(self, claim: str, device: Device, spec: FunctionSpec, loader: Loader,
                step: str, detail: str, touched: bool) -> None:
        metrics.dra_programming(self.driver, device.backend, loader.name, FAILED, 0.0)
        message = f"loading {spec.shown()} with {loader.name} failed at {step}: {detail}"
        log.error("claim %s: device %s: %s", claim, device.id, message)
        if touched:
            self.quarantine.add(device, message)
        if self._told is not None:
            self._told(device.id, claim, "FunctionLoadFailed", f"{message} (claim {claim})")


def _shown_id(spec: FunctionSpec, held: object) -> str:
    return function_shown(spec.family, held if isinstance(held, str) else None,
                          "an unknown function")


def _retrieved(task: asyncio.Task[Outcome]) -> None:
    """A load whose every waiter gave up: its failure was logged and told already."""
    if not task.cancelled():
        task.exception()
