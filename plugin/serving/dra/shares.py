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
  (:func:`function_not_held`), so a claim whose function differs is refused naming both.

Claims being prepared now count as holders too (:meth:`ShareAdmission.admit` reserves what
it let in until the call records or refuses the claim), so two shares of one call, or of two
calls at once, cannot both take the last context.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from plugin.model.allocation import name_some
from plugin.programming.function_config import FunctionSpec
from plugin.programming.ids import dashed
from plugin.serving.dra.holdings import holdings_of, holds_a_share
from plugin.serving.dra.prepared import PreparedClaim, describe
from value_types.claims import ClaimRef, PreparedDevice

PublishedContexts = Callable[[], Mapping[str, int]]
"""Device ID -> contexts of each device published shared now (absent: published whole)."""


def where(device: PreparedDevice) -> str:
    return f"device {device.pool}/{device.device} ({device.device_id})"


class ShareAdmission:
    """Lets a claim's devices in, or refuses the claim naming what collided.

    ``published_contexts()`` says which devices are published shared now, with how many
    contexts; ``recorded()`` gives the claims the checkpoint holds, ``sharing()`` those of
    them that hold a share: all a claim allocated whole must be checked against, so the
    common case (no share anywhere) costs nothing per recorded claim."""

    def __init__(self, published_contexts: PublishedContexts,
                 recorded: Callable[[], Iterable[PreparedClaim]],
                 sharing: Callable[[], Iterable[PreparedClaim]]) -> None:
        self._published = published_contexts
        self._recorded = recorded
        self._sharing = sharing
        self._pending: dict[str, PreparedClaim] = {}
        """Claim UID -> the devices it was let in with, until recorded or refused."""

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
            self._pending[ref.uid] = PreparedClaim(ref, tuple(devices))
            return None
        held = holdings_of(others.values())
        published = self._published() if shares else {}
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
        self._pending[ref.uid] = PreparedClaim(ref, tuple(devices))
        return None

    def release(self, uid: str) -> None:
        """The call preparing claim ``uid`` is over: recorded (the checkpoint speaks for it
        now) or refused."""
        self._pending.pop(uid, None)


def shown(spec: FunctionSpec, function_id: str | None) -> str:
    """A function ID of ``spec``'s family as users and vendor tools print it."""
    if not function_id:
        return "no function this driver can read"
    return f"{spec.field} {function_id if spec.family == 'aws' else dashed(function_id)}"


def function_not_held(device: PreparedDevice, spec: FunctionSpec,
                      held: str | None) -> str | None:
    """Why a share cannot be given ``spec`` on ``device``, which holds ``held`` now, or
    None when it holds it already (nothing to do). A share never programs: loading another
    function would pull it from under the device's other shares."""
    if held == spec.function_id:
        return None
    return (f"share {device.share_id} of {where(device)}: the device holds "
            f"{shown(spec, held)} and the claim's function is {spec.shown()} ({spec.where}); "
            "a shared device is never programmed for one of its shares, so nothing was "
            "loaded")
