"""The rules a share of a device meets before it is prepared (docs/sharing.md).

Under KEP-5075 the scheduler may allocate one device to several claims when it is published
with ``allowMultipleAllocations``: each allocation result is one share, with its own
``shareID`` and the ``contexts`` it consumed. The scheduler counts contexts against what the
ResourceSlice said, but what the driver said may have changed since (the device now held
whole, its setting changed at a restart), and a claim may have been allocated by a
scheduler that saw another slice. So the node checks again, against what it publishes now
and what its checkpoint records, and refuses rather than hand one device to two owners:

* a share is prepared only on a device published shared now (``published_contexts``:
  device ID -> contexts, from the pool's ``DraDevice.shared_contexts``), never on one a
  claim holds whole;
* a device held whole is never prepared for a claim while shares hold it (one owner, or
  only shares);
* the shares of a device, this claim's and every other claim's, never hold more contexts
  than the device has;
* the function a share needs must be the one the device holds: a share never programs
  (:func:`function_not_held`), so a claim whose function differs is refused naming both;
* a share is valid only for the function its device held when it was published shared
  (:class:`SharedAs`, taken when the share is let in): a clear (or a reload by hand) that
  ran in between leaves the device holding something its class never selected, and the
  share is refused naming both (:func:`not_shared_function`), whatever the claim names;
* a device whose setting no longer shares it (:attr:`SharedAs.closed`) takes no new share,
  only the ones recorded already.

Claims being prepared now count as holders too (:meth:`ShareAdmission.admit` reserves what
it let in until the claim is recorded or refused), so two shares of one call, or of two
calls at once, cannot both take the last context. A claim let in twice (two preparations of
it at once) stays reserved until both gave it back: each :meth:`~ShareAdmission.release`
takes back one admission, never one another preparation relies on.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from plugin.model.allocation import name_some
from plugin.programming.function_config import FunctionSpec, function_shown
from plugin.serving.dra.holdings import holdings_of, holds_a_share
from plugin.serving.dra.prepared import PreparedClaim, describe
from value_types.claims import ClaimRef, PreparedDevice

PublishedContexts = Callable[[], Mapping[str, int]]
"""Device ID -> contexts of each device published shared now (absent: published whole)."""


@dataclass(frozen=True)
class SharedAs:
    """What a device published shared is shared as: the function it held when it was
    decided shared (``function_id`` normalised; None: nothing this driver can read), and
    whether it takes new shares."""

    family: str
    function_id: str | None
    closed: str = ""
    """Why the device takes no new share, only those recorded already (its family's
    setting no longer shares it); empty: it takes them while it has contexts left."""
    changing: bool = False
    """A clear or a load is changing what the device holds: a share let in meanwhile
    waits for it, then must find ``function_id`` still there."""

    @property
    def draining(self) -> bool:
        """Whether the device is published so that no new share lands on it."""
        return bool(self.closed) or self.changing

    def shown(self) -> str:
        return function_shown(self.family, self.function_id)


PublishedShares = Callable[[], Mapping[str, SharedAs]]
"""Device ID -> what each device published shared now is shared as."""


def where(device: PreparedDevice) -> str:
    return f"device {device.pool}/{device.device} ({device.device_id})"


class ShareAdmission:
    """Lets a claim's devices in, or refuses the claim naming what collided.

    ``published_contexts()`` says which devices are published shared now, with how many
    contexts; ``recorded()`` gives the claims the checkpoint holds, ``sharing()`` those of
    them that hold a share: all a claim allocated whole must be checked against, so the
    common case (no share anywhere) costs nothing per recorded claim. ``published_shares()``
    is read right after ``published_contexts()``, and says what each of those devices is
    shared as (from the same decision)."""

    def __init__(self, published_contexts: PublishedContexts,
                 recorded: Callable[[], Iterable[PreparedClaim]],
                 sharing: Callable[[], Iterable[PreparedClaim]],
                 published_shares: PublishedShares = dict) -> None:
        self._published = published_contexts
        self._shared_as = published_shares
        self._recorded = recorded
        self._sharing = sharing
        self._pending: dict[str, PreparedClaim] = {}
        """Claim UID -> the devices it was let in with, until recorded or refused."""
        self._admissions: Counter[str] = Counter()
        """Claim UID -> admissions not given back yet: its reservation goes with the last."""
        self._admitted_as: dict[str, dict[str, SharedAs]] = {}
        """Claim UID -> what each device it holds a share of was shared as when the claim
        was let in, until recorded or refused."""

    def admit(self, ref: ClaimRef, devices: Sequence[PreparedDevice]) -> str | None:
        """Check ``devices`` (the claim's, with their share IDs and contexts) against every
        other claim recorded or being prepared: why the claim is refused, naming each
        collision, or None. Admitted, the claim holds what it asked until :meth:`release`."""
        shares = any(d.share_id for d in devices)
        others = {c.ref.uid: c for c in (self._recorded() if shares else self._sharing())
                  if c.ref.uid != ref.uid}
        others.update((uid, c) for uid, c in self._pending.items()
                      if uid != ref.uid and (shares or holds_a_share(c)))
        if not others and not shares:
            self._reserve(ref, devices, {})
            return None
        held = holdings_of(others.values())
        published = self._published() if shares else {}
        shared_as = self._shared_as() if shares else {}
        problems: list[str] = []
        asked: dict[str, tuple[PreparedDevice, int]] = {}
        for device in devices:
            holders = name_some(list(held.holders.get(device.device_id, ())))
            if device.share_id is None:
                if device.device_id in held.shared:
                    problems.append(f"{where(device)} is allocated whole, and shares of it "
                                    f"are held by {holders}: a device has one owner or only "
                                    "shares")
                continue
            contexts = published.get(device.device_id, 0)
            if contexts < 2:
                problems.append(f"share {device.share_id} of {where(device)}: this driver "
                                "publishes the device whole, not shared (a shareID the "
                                "driver never saw); the claim must be allocated again")
            elif device.device_id in held.whole:
                problems.append(f"share {device.share_id} of {where(device)}: the device is "
                                f"held whole by {holders}")
            elif (closed := _closed(shared_as.get(device.device_id))):
                problems.append(f"share {device.share_id} of {where(device)}: the device "
                                f"takes no new share ({closed}); it stays shared only for "
                                "the shares that hold it already")
            else:
                _, before = asked.get(device.device_id, (device, 0))
                asked[device.device_id] = (device, before + (device.contexts or 1))
        for device_id, (device, count) in asked.items():
            taken, contexts = held.shared.get(device_id, 0), published[device_id]
            if taken + count > contexts:
                by = f" ({name_some(list(held.holders[device_id]))})" if taken else ""
                problems.append(f"{where(device)}: the claim asks {count} context(s) and "
                                f"other shares hold {taken}{by}, more contexts than the "
                                f"device has ({contexts})")
        if problems:
            return f"claim {describe(ref)}: {'; '.join(problems)}"
        self._reserve(ref, devices, {d.device_id: shared_as[d.device_id] for d in devices
                                     if d.share_id and d.device_id in shared_as})
        return None

    def _reserve(self, ref: ClaimRef, devices: Sequence[PreparedDevice],
                 admitted_as: dict[str, SharedAs]) -> None:
        """A claim let in (again, when another preparation of it holds it already: the
        first admission's word on what its devices were shared as stays)."""
        self._pending[ref.uid] = PreparedClaim(ref, tuple(devices))
        self._admitted_as.setdefault(ref.uid, admitted_as)
        self._admissions[ref.uid] += 1

    def admitted_as(self, uid: str) -> Mapping[str, SharedAs]:
        """Device ID -> what it was shared as when claim ``uid`` was let in (a device the
        claim holds whole, or one no :data:`PublishedShares` spoke of, is absent): the
        function its share is valid for, checked once no load is changing the device."""
        return self._admitted_as.get(uid, {})

    def release(self, uid: str) -> None:
        """One admission of claim ``uid`` is over: recorded (the checkpoint speaks for it
        now) or refused. The claim stays reserved while another admission of it is not."""
        if self._admissions[uid] > 1:
            self._admissions[uid] -= 1
            return
        self._admissions.pop(uid, None)
        self._pending.pop(uid, None)
        self._admitted_as.pop(uid, None)


def _closed(shared_as: SharedAs | None) -> str:
    return shared_as.closed if shared_as is not None else ""


def not_shared_function(device: PreparedDevice, shared_as: SharedAs,
                        held: str | None) -> str | None:
    """Why a share of ``device``, let in while it was published shared as ``shared_as``,
    cannot be prepared now that it holds ``held`` (None: nothing, or nothing readable), or
    None when it still holds that function. What a class selected (the held function's
    attribute) was true of the device when it was shared, not after a clear or a reload."""
    if held is not None and held == shared_as.function_id:
        return None
    return (f"share {device.share_id} of {where(device)}: the device was published shared "
            f"holding {shared_as.shown()} and holds {function_shown(shared_as.family, held)} "
            "now (cleared or reloaded since); a share is valid only for the function its "
            "device was shared with, so nothing was loaded and the claim must be allocated "
            "again")


def function_not_held(device: PreparedDevice, spec: FunctionSpec,
                      held: str | None) -> str | None:
    """Why a share cannot be given ``spec`` on ``device``, which holds ``held`` now, or
    None when it holds it already (nothing to do). A share never programs: loading another
    function would pull it from under the device's other shares."""
    if held == spec.function_id:
        return None
    holds = function_shown(spec.family, held, "no function this driver can read")
    return (f"share {device.share_id} of {where(device)}: the device holds {holds} and the "
            f"claim's function is {spec.shown()} ({spec.where}); a shared device is never "
            "programmed for one of its shares, so nothing was loaded")
