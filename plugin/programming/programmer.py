"""Making a prepared device hold the function its claim needs: skip, or load, never guess.

For each device of a claim whose configuration names a function (:mod:`.function_config`),
called by NodePrepareResources before the claim is answered, so no container starts on a
device that does not hold its function yet:

1. the image must hold that function and fit the device (:mod:`.image_checks`), on every
   path, so a wrong configuration fails alike on every node;
2. a device that already holds the function is left alone: the common, fast path;
3. otherwise the device must be programmable here (``--programming on`` and a loader whose
   tool or FME node is there) and no other claim may hold it (a prepared one, or one being
   prepared now: its container may be using the function); then, one load at a time per
   card (an FME serves several ports, and ``xbutil``/the AWS SDK take the whole card or
   slot), the loader loads the image, a rescan is asked for, and the claim is answered only
   once discovery reads the new function from the device, within ``timeout`` seconds for
   the whole of it;
4. a load that failed, or that the device never reported, is that claim's error naming the
   step and the kernel's or tool's message; if the card may have been touched, the device
   is quarantined (:mod:`.quarantine`: Unhealthy until a later load succeeds).

Programming happens only here, so only for claims this driver prepares for this node's pool.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from plugin.model.devices import Device, DeviceSet
from plugin.model.programming import OFF
from plugin.process import metrics
from plugin.programming.function_config import FunctionSpec
from plugin.programming.ids import dashed
from plugin.programming.image_checks import ImageChecks, held_function
from plugin.programming.loaders.base import Loader, LoadFailed, LoadJob
from plugin.programming.pending_clears import PendingClears
from plugin.programming.quarantine import Quarantine

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 120.0
SKIPPED = "skipped"
LOADED = "loaded"
FAILED = "failed"
REFUSED = "refused"


def unavailable(device: Device, enabled: bool, loaders: Mapping[str, Loader]) -> str | None:
    """Why ``device`` cannot be given another function on this node, or None: programming
    must be on, and its family's loader must find its way in (tool, FME node)."""
    if not enabled:
        return OFF
    loader = loaders.get(device.backend)
    if loader is None:
        return f"no loader programs {device.backend} devices"
    return loader.unavailable(device)


class ProgrammingRefused(Exception):
    """The device cannot be given the function for this claim; the message says why."""


@dataclass(frozen=True)
class Outcome:
    """What was done for one device of one claim."""

    device_id: str
    spec: FunctionSpec
    result: str
    """:data:`SKIPPED` (held already) or :data:`LOADED`."""
    loader: str = ""
    seconds: float = 0.0

    def message(self) -> str:
        if self.result == SKIPPED:
            return f"{_shown(self.spec)} was loaded already"
        return f"{_shown(self.spec)} loaded by {self.loader} in {self.seconds:.2f} s"


Told = Callable[[str, str, str, str], None]
"""``(device_id, claim, kind, message)`` for Events: kind ``FunctionLoaded`` or
``FunctionLoadFailed``."""


class Programmer:
    """Gives devices the functions their claims need (see the module docstring)."""

    def __init__(self, *, enabled: bool, loaders: Mapping[str, Loader],
                 checks: ImageChecks | None, quarantine: Quarantine,
                 devices: Callable[[], DeviceSet], rescan: Callable[[str], None],
                 driver: str, timeout: float = DEFAULT_TIMEOUT,
                 told: Told | None = None, clears: PendingClears | None = None) -> None:
        self.enabled = enabled
        self.loaders = dict(loaders)
        self.checks = checks
        self.quarantine = quarantine
        self.timeout = timeout
        self.driver = driver
        self._devices = devices
        self._rescan = rescan
        self._told = told
        self.clears = clears or PendingClears(None)
        self._clearing: set[asyncio.Task[None]] = set()
        self._locks: dict[str, asyncio.Lock] = {}
        self._changed = asyncio.Event()
        self._loading: dict[str, asyncio.Task[Outcome]] = {}
        """Device ID -> the load going on now (it outlives a call the kubelet gave up)."""
        self._loading_for: dict[str, str] = {}
        self.waiting: dict[str, str] = {}
        """Claim UID -> the load it waits for now, for a kubelet call that times out."""
        self._claimed: dict[str, set[str]] = {}
        """Device ID -> UIDs of claims being prepared on it now (not yet recorded)."""
        self.outcomes: dict[tuple[str, str], Outcome] = {}
        """(claim UID, device ID) -> what was done, for the claim's status."""

    # -- what the inventory and discover say ------------------------------------------

    def unavailable(self, device: Device) -> str | None:
        """Why ``device`` cannot be given another function on this node, or None."""
        return unavailable(device, self.enabled, self.loaders)

    def programmable(self, device: Device) -> bool:
        return self.unavailable(device) is None

    # -- the device feed ----------------------------------------------------------------

    def devices_changed(self) -> None:
        """Discovery published a new device set (a load may show in it)."""
        self._changed.set()

    # -- claims -------------------------------------------------------------------------

    def claim_started(self, uid: str, device_ids: Iterable[str]) -> None:
        for device_id in device_ids:
            self._claimed.setdefault(device_id, set()).add(uid)

    def configuration_refused(self, device_ids: Iterable[str]) -> None:
        """A claim's configuration could not be read: each of its devices counts as refused."""
        devices = self._devices()
        for device_id in device_ids:
            device = devices.get(device_id)
            metrics.dra_programming(self.driver, device.backend if device else "", "",
                                    REFUSED, 0.0)

    def claim_finished(self, uid: str) -> None:
        """The claim is recorded, or refused: the checkpoint speaks for it from now on."""
        for device_id in [d for d, uids in self._claimed.items() if uid in uids]:
            self._claimed[device_id].discard(uid)
            if not self._claimed[device_id]:
                del self._claimed[device_id]

    def unprepared(self, uid: str, holders: Callable[[str], list[str]]) -> None:
        """Claim ``uid`` is unprepared: its outcomes are no longer shown, and the function
        its DeviceClass clears to is loaded, after the kubelet's answer (see
        :mod:`.pending_clears`), unless another claim holds the device by then."""
        for key in [k for k in self.outcomes if k[0] == uid]:
            del self.outcomes[key]
        for device_id, clear in self.clears.take(uid).items():
            task = asyncio.get_running_loop().create_task(
                self._clear(uid, device_id, clear, holders), name=f"clear {device_id}")
            self._clearing.add(task)
            task.add_done_callback(self._clearing.discard)

    async def _clear(self, uid: str, device_id: str, clear: FunctionSpec,
                     holders: Callable[[str], list[str]]) -> None:
        what = f"clearing after claim {uid}"
        try:
            outcome = await self.ensure(what, f"clear:{uid}", device_id, clear, holders)
        except ProgrammingRefused as refusal:
            log.warning("%s: %s", what, refusal)
            return
        self.outcomes.pop((f"clear:{uid}", device_id), None)
        log.info("%s: device %s: %s", what, device_id, outcome.message())

    async def close(self) -> None:
        """Wait for clears under way (a load is never cut off half-way)."""
        if self._clearing:
            await asyncio.gather(*self._clearing, return_exceptions=True)

    async def ensure(self, claim: str, uid: str, device_id: str, spec: FunctionSpec,
                     holders: Callable[[str], list[str]]) -> Outcome:
        """Make ``device_id`` hold ``spec`` for claim ``uid`` (``claim``: its name, for
        messages); ``holders(device_id)`` names the other prepared claims that hold the
        device. :class:`ProgrammingRefused` with the reason when it cannot."""
        began = time.monotonic()
        device = self._device(device_id)
        if device.backend != spec.family:
            raise self._refuse(device, spec, f"the configuration names {spec.field}, a "
                               f"function of the {spec.family} family, for a "
                               f"{device.backend} device")
        if self.checks is not None:
            try:
                self.checks.check(spec, device)
            except ValueError as exc:
                raise self._refuse(device, spec, str(exc)) from None
        elif spec.image is not None:
            raise self._refuse(device, spec, "no image library is configured "
                               "(--image-library)")
        held = await self._held(device)
        if held == spec.function_id:
            return self._done(uid, Outcome(device_id, spec, SKIPPED), began)
        why = self.unavailable(device)
        if why is not None:
            raise self._refuse(device, spec, f"it holds {_shown_id(spec, held)} and cannot "
                               f"be programmed: {why}")
        loading = self._loading.get(device_id)
        if loading is None or loading.done():
            loading = asyncio.create_task(self._locked_load(claim, uid, device_id, spec,
                                                            holders, began),
                                          name=f"load onto {device_id}")
            loading.add_done_callback(_retrieved)
            self._loading[device_id] = loading
        elif self._loading_for.get(device_id) != spec.function_id:
            await asyncio.shield(loading)  # another function is going on: then ours
            return await self.ensure(claim, uid, device_id, spec, holders)
        # Shielded: the kubelet giving up on its call must not cut a load off half-way
        # (a card left half-programmed); the load goes on, and the kubelet's next call for
        # this claim finds it done, or waits for it.
        self.waiting[uid] = f"loading {_shown(spec)} onto {device_id}"
        try:
            outcome = await asyncio.shield(loading)
        finally:
            self.waiting.pop(uid, None)
        return self._done(uid, replace(outcome, device_id=device_id), began)

    async def _locked_load(self, claim: str, uid: str, device_id: str, spec: FunctionSpec,
                           holders: Callable[[str], list[str]], began: float) -> Outcome:
        self._loading_for[device_id] = spec.function_id
        try:
            async with self._lock(self._device(device_id)):
                device = self._device(device_id)  # as it is now, after any load before ours
                held = await self._held(device)
                if held == spec.function_id:
                    return Outcome(device_id, spec, SKIPPED)
                others = sorted(set(holders(device_id)) |
                                {u for u in self._claimed.get(device_id, ()) if u != uid})
                if others:
                    raise self._refuse(device, spec, f"it holds {_shown_id(spec, held)} for "
                                       f"{len(others)} other claim(s) "
                                       f"({', '.join(others[:3])}); a device is never "
                                       "reprogrammed under a claim that holds it")
                return await self._load(claim, device, spec, self.loaders[device.backend],
                                        began)
        finally:
            self._loading_for.pop(device_id, None)

    async def _load(self, claim: str, device: Device, spec: FunctionSpec, loader: Loader,
                    began: float) -> Outcome:
        deadline = began + self.timeout
        log.info("claim %s: loading %s onto %s with %s", claim, _shown(spec), device.id,
                 loader.name)
        job = LoadJob(device, spec.function_id, self.checks.library if self.checks else None,
                      spec.image, timeout=max(deadline - time.monotonic(), 0.1))
        try:
            await loader.load(job)
        except LoadFailed as failure:
            self._failed(claim, device, spec, loader, failure.step, failure.detail,
                         failure.touched)
            raise ProgrammingRefused(f"loading {_shown(spec)} onto {device.id} failed at "
                                     f"{failure.step}: {failure.detail}") from None
        self._rescan(f"{spec.function_id} loaded onto {device.id}")
        reported = await self._reported(device.id, spec.function_id, deadline)
        if reported is not True:
            detail = (f"the device did not report it within {self.timeout:g} s "
                      f"(it reports {_shown_id(spec, reported)})")
            self._failed(claim, device, spec, loader, "waiting for the new function", detail,
                         True)
            raise ProgrammingRefused(f"loading {_shown(spec)} onto {device.id}: {detail}")
        seconds = time.monotonic() - began
        self.quarantine.clear(device.id)
        outcome = Outcome(device.id, spec, LOADED, loader.name, seconds)
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
        loader_reads = self._device(device_id).backend == "aws"
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
        held = held_function(device)
        if held is not None or device.backend != "aws":
            return held
        loader = self.loaders.get(device.backend)
        if loader is None:
            return None
        try:
            return await loader.loaded(device)
        except LoadFailed as failure:
            log.warning("cannot tell which function %s holds: %s", device.id, failure)
            return None

    def _device(self, device_id: str) -> Device:
        device = self._devices().get(device_id)
        if device is None:
            raise ProgrammingRefused(f"device {device_id} is no longer on this node")
        return device

    def _lock(self, device: Device) -> asyncio.Lock:
        card = device.attribute("fme_node") or device.attribute("pci_address") or device.id
        return self._locks.setdefault(card, asyncio.Lock())

    def _done(self, uid: str, outcome: Outcome, began: float) -> Outcome:
        if outcome.spec.clear is not None:
            self.clears.record(uid, outcome.device_id, outcome.spec.clear)
        if outcome.result == SKIPPED:
            device = self._devices().get(outcome.device_id)
            family = device.backend if device is not None else outcome.spec.family
            metrics.dra_programming(self.driver, family, "", SKIPPED,
                                    time.monotonic() - began)
        self.outcomes[(uid, outcome.device_id)] = outcome
        return outcome

    def _refuse(self, device: Device, spec: FunctionSpec, why: str) -> ProgrammingRefused:
        metrics.dra_programming(self.driver, device.backend, "", REFUSED, 0.0)
        return ProgrammingRefused(f"device {device.id} cannot be given {_shown(spec)} "
                                  f"({spec.where}): {why}")

    def _failed(self, claim: str, device: Device, spec: FunctionSpec, loader: Loader,
                step: str, detail: str, touched: bool) -> None:
        metrics.dra_programming(self.driver, device.backend, loader.name, FAILED, 0.0)
        message = f"loading {_shown(spec)} with {loader.name} failed at {step}: {detail}"
        log.error("claim %s: device %s: %s", claim, device.id, message)
        if touched:
            self.quarantine.add(device.id, message)
        if self._told is not None:
            self._told(device.id, claim, "FunctionLoadFailed", f"{message} (claim {claim})")


def _shown(spec: FunctionSpec) -> str:
    shown = spec.function_id if spec.family == "aws" else dashed(spec.function_id)
    return f"{spec.field} {shown}"


def _shown_id(spec: FunctionSpec, held: object) -> str:
    if not isinstance(held, str) or not held:
        return "an unknown function"
    return f"{spec.field} {held if spec.family == 'aws' else dashed(held)}"



def _retrieved(task: asyncio.Task[Outcome]) -> None:
    """A load whose every waiter gave up: its failure was logged and told already."""
    if not task.cancelled():
        task.exception()
