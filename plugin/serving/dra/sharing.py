"""Which devices the DRA driver publishes for sharing now, and with how many contexts.

A device is published shared (``DraDevice.shared_contexts = N``, N >= 2) when its family's
``--dra-share`` setting (:mod:`.share_setting`) gives N >= 2 for the function it holds now,
and no claim holds it whole. Health does not enter into it: an unhealthy shared device is
published shared and tainted, as any device is.

* ``N``: every device of the family that holds a function (an Intel port's ``afuID``, an
  Alveo card's ``xclbinUUID``) gets N contexts.
* ``image``: the image tells N, and only the driver knows which image a device's function came
  from: its load record (:mod:`plugin.programming.load_record`) names it, for as long as the
  device still reports the recorded function. The header is read through the per-file-version
  memory the claims' checks use (:class:`~plugin.programming.image_checks.ImageChecks`), so
  a republish costs one ``stat`` per such device, and, as those checks do, a first read of a
  header (a few hundred bytes) happens on the event loop. An image that no longer holds the
  function the device reports (replaced in the library since), or that cannot be read, tells
  nothing: the device is published whole, and why is logged once.
* A device that holds nothing (an Alveo card with no xclbin; a port whose function the
  setting cannot count) is published whole: the first claim that loads a shareable function
  takes it whole, and once that claim is gone (without a clear) the device is published
  shared.

Who holds a device comes from the driver's checkpoint, as a :class:`ClaimHolds`: a device a
claim holds whole is published whole (no new owner may join it); a device shares hold keeps
the N it was published with, even if the setting or the image would now say otherwise, so
a share's contexts never vanish under it; a device a claim is being prepared on keeps what it
was published as until the claim is recorded (a claim loading a shareable function must not
see its device offered to others before it holds it), and so does a device a load or a clear
is changing (the programmer's word: a clear of the last share's device runs after that share
is gone). Built by :func:`claim_holds` from the plain sets the checkpoint gives
(:meth:`~plugin.serving.dra.checkpoint.ClaimCheckpoint.device_holdings`). While the record
cannot be read, nothing is published shared. The N remembered is this process's: a
restarted driver works it out again from the setting and the image, never below what the
recorded shares hold.

What each device published shared is shared as (:func:`shared_as`,
:class:`~plugin.serving.dra.shares.SharedAs`) goes with it: the function it held when it
was decided shared, kept while it is kept shared (so a clear under way does not change it),
taken from what the device holds after a restart; a share is valid for that function only.
A device published shared that must take no new share is **draining**, published with the
in-use taint and value :data:`DRAINING`: while a load or a clear changes what it holds, and
while shares hold a device its family's setting no longer shares (turned off at a restart,
or the image no longer counts) or that holds another function than it was shared with
(reloaded by hand under them): otherwise the scheduler could place a new share on a
function about to go, or on a device that is to be published whole.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TypeVar

from plugin.programming.image_checks import ImageChecks, held_function
from plugin.programming.load_record import LoadRecord, LoadRecords
from plugin.programming.programmer import Programmer
from plugin.serving.dra.checkpoint import ClaimCheckpoint
from plugin.serving.dra.share_setting import FamilyShare, setting_of, sharing_on
from plugin.serving.dra.shares import SharedAs
from value_types.devices import Device, DeviceSet

log = logging.getLogger(__name__)

_T = TypeVar("_T")

DRAINING = "draining"
"""Value of the in-use taint (``<driver>/in-use``, NoSchedule) of a device published
shared that takes no new share now (a label value, as ``DraDevice.held_by``)."""
CLOSED = "its family's --dra-share setting no longer shares it"
MOVED = "it holds another function than the one it was shared with (reloaded by hand?)"


@dataclass(frozen=True)
class ClaimHolds:
    """Which devices prepared claims hold: ``whole`` (a result without a share) and
    ``shares`` (device ID -> contexts its shares hold together)."""

    whole: frozenset[str] = frozenset()
    shares: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    preparing: frozenset[str] = frozenset()
    """Devices claims are being prepared on, not recorded yet: each keeps what it was
    published as, so a device a claim is loading for is not offered to others meanwhile."""
    changing: frozenset[str] = frozenset()
    """Devices a load or a clear is changing (the programmer's word): each keeps what it
    was published as, draining."""
    unknown: bool = False
    """The record cannot be read (not yet, or not by this release): every device counts as
    held whole, so none is offered to a second owner on a guess."""


NO_HOLDS = ClaimHolds()
UNKNOWN = ClaimHolds(unknown=True)


def claim_holds(whole: Iterable[str], shares: Mapping[str, int],
                preparing: Iterable[str] = (), changing: Iterable[str] = ()) -> ClaimHolds:
    """The holds of the checkpoint's claims: devices held whole, and device ID -> contexts
    held by shares (a device with shares is in ``shares`` even at 0 contexts); the devices
    claims are being prepared on, and those a load or a clear is changing."""
    return ClaimHolds(frozenset(whole), MappingProxyType(dict(shares)), frozenset(preparing),
                      frozenset(changing))


def decide(shares: tuple[FamilyShare, ...], devices: DeviceSet, holds: ClaimHolds,
           served: Callable[[Device], int | None], before: Mapping[str, int]
           ) -> dict[str, int]:
    """Device ID -> contexts for every device published shared (see the module docstring);
    ``served(device)`` is what its image says (``image`` families), ``before`` what each
    device was published with last."""
    found: dict[str, int] = {}
    if holds.unknown:
        return {}
    for device in devices:
        if device.id in holds.whole:
            continue
        if device.id in holds.shares:
            kept = before.get(device.id) or _contexts(shares, device, served) or 0
            found[device.id] = max(kept, 2, holds.shares[device.id])
            continue
        if device.id in holds.preparing or device.id in holds.changing:
            if before.get(device.id, 0) >= 2:
                found[device.id] = before[device.id]
            continue
        contexts = _contexts(shares, device, served)
        if contexts is not None and contexts >= 2:
            found[device.id] = contexts
    return found


def shared_as(shares: tuple[FamilyShare, ...], devices: DeviceSet, holds: ClaimHolds,
              served: Callable[[Device], int | None], found: Mapping[str, int],
              before: Mapping[str, SharedAs]) -> dict[str, SharedAs]:
    """Device ID -> what each device of ``found`` (:func:`decide`'s answer) is shared as:
    the function ``before`` says for a device kept as it was published (shares, a claim
    being prepared, a load or a clear hold it), else the one it holds now; draining while
    something changes it, or while shares hold it and its setting no longer shares it or it
    holds another function than it was shared with."""
    out: dict[str, SharedAs] = {}
    for device in devices:
        if device.id not in found:
            continue
        kept = device.id in holds.shares or device.id in holds.preparing or \
            device.id in holds.changing
        known = before.get(device.id) if kept else None
        held = held_function(device)
        function = known.function_id if known is not None else held
        closed = ""
        if device.id in holds.shares and (_contexts(shares, device, served) or 0) < 2:
            closed = CLOSED
        elif device.id in holds.shares and function != held:
            closed = MOVED
        out[device.id] = SharedAs(device.backend, function, closed,
                                  device.id in holds.changing)
    return out


def _contexts(shares: tuple[FamilyShare, ...], device: Device,
              served: Callable[[Device], int | None]) -> int | None:
    setting = setting_of(shares, device.backend)
    if setting == 0 or held_function(device) is None:
        return None
    return served(device) if setting is None else setting


class Sharing:
    """The driver's sharing decision, with what it needs to remember between publications:
    the N each device was published with, and what was said about images already."""

    def __init__(self, shares: tuple[FamilyShare, ...], checks: ImageChecks | None,
                 state_dir: Path | None,
                 preparing: Callable[[], frozenset[str]] = frozenset,
                 changing: Callable[[], frozenset[str]] = frozenset) -> None:
        self.shares = shares
        self._preparing = preparing
        """The devices claims are being prepared on now (the programmer's word)."""
        self._changing = changing
        """The devices a load or a clear is changing now (the programmer's word)."""
        self.enabled = sharing_on(shares)
        self._checks = checks
        self._records = LoadRecords(state_dir)
        self._published: dict[str, int] = {}
        self._shared_as: dict[str, SharedAs] = {}
        self._said: set[tuple[str, str, str]] = set()
        self._holds: tuple[object, ClaimHolds] = (None, NO_HOLDS)

    @classmethod
    def of(cls, shares: tuple[FamilyShare, ...], programmer: Programmer | None) -> Sharing:
        """The decision for ``shares``, reading images through ``programmer``'s checks and
        its load records (where it keeps none, ``image`` finds no image to ask)."""
        if programmer is None:
            return cls(shares, None, None)
        records = programmer.records.path
        return cls(shares, programmer.checks, records.parent if records is not None else None,
                   programmer.preparing, programmer.changing)

    def republishing(self, observer: Callable[[_T], None], republish: Callable[[], None]
                     ) -> Callable[[_T], None]:
        """``observer`` of prepared or unprepared claims, followed by ``republish`` where
        devices are shared, or shares are recorded (the setting turned off under them):
        what claims hold decides whether a device is published shared."""
        def changed(claims: _T) -> None:
            observer(claims)
            if self.enabled or self._holds[1].shares:
                republish()
        return changed

    def drained(self, republish: Callable[[], None]) -> Callable[[], None]:
        """What to call when a load or a clear ends: ``republish`` if a device is published
        shared (the one it changed was published draining meanwhile)."""
        def ended() -> None:
            if self._published:
                republish()
        return ended

    def holds(self, checkpoint: ClaimCheckpoint | None) -> ClaimHolds:
        """What the claims ``checkpoint`` records hold, worked out again only when the record
        (or the devices claims are being prepared on) changed; none while no family is
        shared and no share is recorded. A record not read yet is never read here (only the
        instance holding the driver's socket reads it): until it is, and while it cannot be,
        the holds are :data:`UNKNOWN` where a family is shared."""
        if checkpoint is None or checkpoint.held() is None:
            return UNKNOWN if self.enabled else NO_HOLDS
        if not self.enabled and not checkpoint.sharing_claims():
            self._holds = (None, NO_HOLDS)
            return NO_HOLDS
        preparing, changing = self._preparing(), self._changing()
        key = (id(checkpoint), checkpoint.writes, checkpoint.held(), preparing, changing)
        holdings = checkpoint.device_holdings() if self._holds[0] != key else None
        if holdings is not None:
            self._holds = (key, claim_holds(holdings.whole, holdings.shared, preparing,
                                            changing))
        return self._holds[1]

    @property
    def published(self) -> Mapping[str, int]:
        """Device ID -> N of the devices last decided shared (what the pool publishes)."""
        return MappingProxyType(self._published)

    @property
    def shared_as(self) -> Mapping[str, SharedAs]:
        """Device ID -> what each device last decided shared is shared as: the function a
        share of it is for, and whether it is draining."""
        return MappingProxyType(self._shared_as)

    def draining(self) -> frozenset[str]:
        """The devices last decided shared that take no new share now."""
        return frozenset(d for d, terms in self._shared_as.items() if terms.draining)

    def contexts(self, devices: DeviceSet, holds: ClaimHolds) -> Mapping[str, int]:
        """Device ID -> N for the devices published shared now (empty: sharing is off, and
        no share is recorded)."""
        if not self.enabled and not holds.shares:
            self._published, self._shared_as = {}, {}
            return {}
        records: Mapping[str, LoadRecord] = {}
        if any(s.contexts is None for s in self.shares):
            records = self._records.current()
        def served(device: Device) -> int | None:
            return self._served(device, records.get(device.id))

        found = decide(self.shares, devices, holds, served, self._published)
        self._shared_as = shared_as(self.shares, devices, holds, served, found,
                                    self._shared_as)
        self._published = found
        return found

    def _served(self, device: Device, record: LoadRecord | None) -> int | None:
        """What the image of the function ``device`` holds says it serves; None when the
        driver did not load it (or loaded something else since) or the image cannot tell."""
        held = held_function(device)
        if record is None or record.image is None or held != record.function_id:
            return None
        if self._checks is None:
            return None
        try:
            function, contexts = self._checks.served(record.image, device.backend)
        except ValueError as exc:
            self._say(device, record.image, f"cannot be read ({exc})")
            return None
        if function != held:
            self._say(device, record.image, f"no longer holds the function the device "
                      f"holds ({function}, not {held}): replaced in the library?")
            return None
        if contexts is None:
            self._say(device, record.image, "does not say how many users it serves")
        return contexts

    def _say(self, device: Device, image: str, why: str) -> None:
        key = (device.id, image, why)
        if key not in self._said:
            self._said.add(key)
            log.warning("device %s is published whole: image %s, which it was loaded from, "
                        "%s", device.id, image, why)
