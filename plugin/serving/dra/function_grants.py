"""``--function-grants``: a guarded function reaches only the namespaces granted it, by every path.

Admission (docs/programming.md) refuses what *names* a guarded class in a namespace without
its grant. A claim of any other class (the plain ``accelerator.b-com.com``,
``b-com.com/accelerator``, a class added later) may still land on a device that holds a
guarded function, whole or as a share, and a claim made before a grant was withdrawn is still
prepared. So, at prepare, once nothing is changing the claim's devices, this module checks the
function each device holds, or will hold for the claim, against the catalogue
(:mod:`plugin.programming.guarded`) and the claim's Namespace, and refuses the claim before
anything is loaded. The same catalogue tells the publisher which devices hold a guarded
function (attribute ``functionGuarded``), so the plain class can select only the others.

What is read, through the API client the driver has (RBAC: ``get`` on ``namespaces``,
``list`` on ``configmaps`` of the catalogue's namespace, and the ``list`` on
``deviceclasses`` it has already):

* the catalogue: the ConfigMaps of ``--function-grants <namespace>`` labelled as the
  admission policy's binding finds them (:data:`~plugin.programming.guarded.CATALOGUE_LABELS`);
  their keys are guarded classes, added to the rendered copy (``--guarded-classes``), which
  stays guarded while no such ConfigMap is there; a failure to list them takes every class
  naming a function as guarded;
* the DeviceClasses, for the function each guarded class names; unreadable, every device
  holding a function is refused (and published guarded) until they can be read;
* the claim's Namespace, for its grant labels; unreadable, a device holding a guarded
  function is refused.

Each is kept :data:`FRESH_FOR` seconds, so a burst of prepares costs one read of each; the
catalogue is read again every :data:`REFRESH_INTERVAL` seconds for the publisher.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from api_versions.device_classes import driver_configs
from api_versions.k8s_objects import data_keys_of, labels_of
from plugin.programming.guarded import (
    CATALOGUE_LABELS,
    Function,
    GrantsSource,
    GuardedFunctions,
    Unread,
    granted_classes,
    guarded_functions,
)
from plugin.programming.image_checks import DESCRIBED_ONLY, held_function
from plugin.programming.programmer import Programmer
from plugin.serving.dra.apiserver import ApiFailure, NotFound
from plugin.serving.dra.described_slots import DescribedSlots
from value_types.claims import ClaimRef, PreparedDevice
from value_types.devices import Device, DeviceSet

log = logging.getLogger(__name__)

FRESH_FOR = 2.0
"""Seconds a read catalogue or Namespace is used before it is read again."""
REFRESH_INTERVAL = 60.0
"""Seconds between the catalogue reads that keep the published attribute current."""
NOT_READ = "the function catalogue has not been read yet"


class Reads(Protocol):
    """The API calls this module makes (:class:`~.apiserver.ApiServer`'s)."""

    async def config_maps(self, namespace: str,
                          labels: dict[str, str]) -> list[dict[str, Any]]: ...
    async def get_namespace(self, name: str) -> dict[str, Any]: ...
    async def device_classes(self) -> list[dict[str, Any]]: ...


HeldFunction = Callable[[str], Awaitable[Function | Unread | None]]
"""Device ID -> the function it holds once nothing is changing it (None: nothing; Unread: it
cannot be read, so it may be any of its family's)."""


class FunctionGrants:
    """The catalogue as read last, the Namespaces' grants, and the check at prepare."""

    def __init__(self, driver: str, source: GrantsSource, api: Callable[[], Reads],
                 held: HeldFunction, clock: Callable[[], float] = time.monotonic) -> None:
        self.driver = driver
        self._held = held
        self.source = source
        self._api = api
        self._clock = clock
        self.guarded = GuardedFunctions(blind=NOT_READ)
        self._read_at: float | None = None
        self._reading: asyncio.Lock | None = None
        self._namespaces: dict[str, tuple[float, frozenset[str] | None, str]] = {}
        self.on_changed: Callable[[], None] = lambda: None
        """Called when what the catalogue guards changed: the pool is published again."""
        self.slots = DescribedSlots(held, lambda: self.on_changed(),
                                    lambda family: self.guarded.may_guard(family))
        """What the AWS slots hold, as their SDK describes them, for the publisher."""

    # -- the catalogue ----------------------------------------------------------------------

    async def catalogue(self) -> GuardedFunctions:
        """What is guarded now, read again when older than :data:`FRESH_FOR`."""
        if self._reading is None:
            self._reading = asyncio.Lock()
        async with self._reading:
            if self._read_at is None or self._clock() - self._read_at >= FRESH_FOR:
                await self.refresh()
        return self.guarded

    async def refresh(self) -> None:
        api, source = self._api(), self.source
        keys: list[str] = []
        assumed = ""
        try:
            keys = [key for found in await api.config_maps(source.namespace,
                                                           dict(CATALOGUE_LABELS))
                    for key in data_keys_of(found)]
        except ApiFailure as exc:
            assumed = f"the catalogue ConfigMaps of {source.namespace} cannot be read: {exc}"
        try:
            configs = driver_configs(await api.device_classes(), self.driver)
        except (ApiFailure, TimeoutError) as exc:
            found = GuardedFunctions(blind=f"the DeviceClasses cannot be read: {exc}")
        else:
            found = guarded_functions(self.driver, {*source.classes, *keys}, configs, assumed)
        self._read_at = self._clock()
        if found != self.guarded:
            if found.blind or found.assumed or found.unreadable:
                log.warning("function grants: %s", found.blind or found.assumed or "; ".join(
                    f"DeviceClass {c}: {why}" for c, why in sorted(found.unreadable.items())))
            log.info("function grants: %d guarded function(s) from %d class(es)",
                     len(found.classes), len({c for cs in found.classes.values() for c in cs}))
            self.guarded = found
            self.on_changed()

    async def run(self, interval: float = REFRESH_INTERVAL) -> None:
        """Keep the catalogue and the slots' describes current for the publisher, until
        cancelled."""
        read = asyncio.Event()
        await asyncio.gather(self._keep_catalogue(interval, read), self._describe_after(read))

    async def _keep_catalogue(self, interval: float, read: asyncio.Event) -> None:
        while True:
            try:
                await self.catalogue()
            except Exception:  # a bug here must not stop the driver; prepare fails closed
                log.exception("function grants: reading the catalogue failed")
            read.set()
            await asyncio.sleep(interval)

    async def _describe_after(self, read: asyncio.Event) -> None:
        """Slots are described once the catalogue was first read: before, every family
        may be guarded, and every slot would be described for nothing."""
        await read.wait()
        await self.slots.run()

    def publishing(self) -> tuple[GuardedFunctions, int]:
        """What :meth:`publishes_guarded` answers from: when it changes, the pool is built
        again."""
        return self.guarded, self.slots.generation

    def publishes_guarded(self, device: Device) -> bool:
        """Whether ``device`` is published ``functionGuarded``: it holds a guarded function
        (or any, while what is guarded cannot be told). An AWS slot holds what its SDK last
        described (:mod:`.described_slots`); until then, or while that fails, it may hold
        anything of its family, and is guarded while a function of its family is."""
        held = held_function(device)
        if held is not None or device.backend not in DESCRIBED_ONLY:
            return self.guarded.guards((device.backend, held) if held else None)
        if not self.guarded.may_guard(device.backend):
            return False  # nothing of its family is guarded: no describe needed
        found = self.slots.held(device)
        return True if isinstance(found, Unread) else self.guarded.guards(found)

    # -- a namespace's grants ---------------------------------------------------------------

    async def granted(self, namespace: str) -> tuple[frozenset[str] | None, str]:
        """The classes ``namespace`` is granted (None: its Namespace cannot be read, and
        why)."""
        now = self._clock()
        cached = self._namespaces.get(namespace)
        if cached is not None and now - cached[0] < FRESH_FOR:
            return cached[1], cached[2]
        try:
            found: frozenset[str] | None = granted_classes(labels_of(
                await self._api().get_namespace(namespace)))
            why = ""
        except ApiFailure as exc:
            gone = isinstance(exc, NotFound) and not exc.unserved
            found, why = (frozenset(), "") if gone else (None, f"Namespace {namespace}: {exc}")
        except TimeoutError:
            found, why = None, f"reading Namespace {namespace} timed out"
        if len(self._namespaces) > 1024:
            self._namespaces.clear()
        self._namespaces[namespace] = (self._clock(), found, why)
        return found, why

    # -- at prepare -------------------------------------------------------------------------

    async def refusals(self, ref: ClaimRef, devices: Sequence[PreparedDevice],
                       loads: Mapping[str, Function]
                       ) -> list[tuple[PreparedDevice, Function, str]]:
        """Each device of claim ``ref`` the claim's namespace may not have, with the
        function (an empty ID: what it holds cannot be read) and why: the function the claim
        loads there (``loads``: device ID -> function, for a device allocated whole whose
        claim names one), else the one the device holds (asked once nothing is changing
        it). Empty: prepare goes on."""
        found = []
        guarded: GuardedFunctions | None = None
        for device in devices:
            function = loads.get(device.device_id) if device.share_id is None else None
            held = function or await self._held(device.device_id)
            if held is None:
                continue
            if guarded is None:
                guarded = await self.catalogue()
            if isinstance(held, Unread):
                if not guarded.may_guard(held.family):
                    continue  # no function of its family is guarded
                granted, why = await self.granted(ref.namespace)
                refusal = guarded.unread_refusal(ref.namespace, held, granted, why)
                if refusal is not None:
                    found.append((device, (held.family, ""), guarded.said(refusal)))
                continue
            function = held
            if not (guarded.blind or guarded.unreadable or function in guarded.classes):
                continue
            granted, why = await self.granted(ref.namespace)
            refusal = guarded.refusal(ref.namespace, function, granted, why,
                                      loads=device.device_id in loads
                                      and device.share_id is None)
            if refusal is not None:
                found.append((device, function, guarded.said(refusal)))
        return found


def held_on(devices: Callable[[], DeviceSet], programmer: Programmer | None) -> HeldFunction:
    """What a device holds, as the check at prepare asks it: once no load or clear is
    changing it (the programmer waits for those, and asks an AWS slot's SDK), else as
    discovery read it."""

    async def held(device_id: str) -> Function | Unread | None:
        function_id, why = (await programmer.held_or_why(device_id) if programmer is not None
                            else (None, ""))
        device = devices().get(device_id)
        if device is None:
            return None
        if programmer is None:
            function_id = held_function(device)
        if why:
            return Unread(device.backend, why)
        return (device.backend, function_id) if function_id else None

    return held
