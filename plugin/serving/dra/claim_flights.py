"""One preparation per claim, however many NodePrepareResources calls ask for it at once.

The 1.36 kubelet calls NodePrepareResources outside its claim-cache lock
(``pkg/kubelet/cm/dra/manager.go`` prepareResources): two pods sharing one claim send it twice
at once, and a call repeated after its 45 s deadline overlaps the first, which may still be
loading. Answering each call on its own would read, let in and load the claim once per call,
and the first call to end would give up what a later one still relies on (its share's
contexts, its whole device), so that another claim could be let in on top of it.

So each claim UID has at most one *flight*: a task that reads the claim, lets it in and gives
its devices their function (:meth:`ClaimFlights.join`). Every call for the UID joins that
flight and waits for it with its own deadline; the first call to find it ready records it
(with the call's other claims, one checkpoint change) and every call gets that answer. What
the flight reserved (:class:`Hold`: its share or whole device in ``ShareAdmission``, no other
load on its devices in the ``Programmer``) is held until the flight ends: recorded, refused,
or left by its last call before it ended (that call's deadline passed, or it was cancelled).
A flight left so is cancelled and leaves nothing behind, but a load it started goes on
(shielded in the programmer) and the next call for the claim waits for it.

An unprepare and a prepare of one UID never overlap (:meth:`ClaimFlights.unpreparing`): an
unprepare waits for the claim's flight to end (within its own deadline; the claim is that
call's error otherwise, and the kubelet calls again), so it never answers "done" for a claim
a prepare then records, nor removes a record a prepare under way would write again; and a
prepare waits for an unprepare of its claim under way before it looks at the record.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field

from plugin.serving.dra.prepare_functions import Refused
from plugin.serving.dra.prepared import PreparedClaim, describe
from value_types.claims import ClaimRef, ClaimResult

log = logging.getLogger(__name__)


class Hold:
    """What one flight reserved for its claim; each reservation released once, when the
    flight ends, and only by it (never another call's)."""

    def __init__(self) -> None:
        self._releases: list[Callable[[], None]] = []

    def take(self, release: Callable[[], None]) -> None:
        """Something was reserved: ``release()`` gives it back when the flight ends."""
        self._releases.append(release)

    def release(self) -> None:
        releases, self._releases = self._releases, []
        for release in reversed(releases):
            release()


Start = Callable[[ClaimRef, Hold], Awaitable[PreparedClaim]]
"""Read, let in and program one claim, taking what it reserves into the hold."""
Record = Callable[[list[PreparedClaim], dict[str, ClaimResult]], Awaitable[None]]
"""Record claims (one checkpoint change), putting each one's answer into the dict."""
Loading = Callable[[], Mapping[str, str]]
"""Claim UID -> the load it waits for now (the programmer's word)."""


@dataclass(eq=False)
class Flight:
    """The preparation of one claim, shared by every call asking for it meanwhile."""

    ref: ClaimRef
    task: asyncio.Task[PreparedClaim]
    hold: Hold
    callers: int = 0
    recording: bool = False
    """A call is recording it now: the others wait for that call's answer."""
    answer: ClaimResult | None = None
    """Every caller's answer, once the flight is over."""
    ended: bool = False

    def ready(self) -> bool:
        """Prepared, waiting to be recorded by a call."""
        return (self.answer is None and not self.recording and self.task.done()
                and not self.task.cancelled() and self.task.exception() is None)


@dataclass(eq=False)
class ClaimFlights:
    """The flights of the claims being prepared now, and the unprepares under way."""

    start: Start
    record: Record
    loading: Loading = dict
    _flights: dict[str, Flight] = field(default_factory=dict)
    _unpreparing: dict[str, int] = field(default_factory=dict)
    _touching: dict[str, int] = field(default_factory=dict)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def in_flight(self) -> frozenset[str]:
        """UIDs of the claims being prepared now (or answered again from the record)."""
        return frozenset(self._flights) | frozenset(self._touching)

    # -- prepare -------------------------------------------------------------------------

    async def unprepared(self, refs: Iterable[ClaimRef], deadline: float | None
                         ) -> dict[str, str]:
        """Once no unprepare of any of ``refs`` is under way: the claims whose unprepare was
        still going at ``deadline``, with their answer (empty: none)."""
        refs = [r for r in refs if r.uid in self._unpreparing]
        if not refs:  # the common case, without a wait
            return {}
        await self._until(lambda: not any(r.uid in self._unpreparing for r in refs), deadline)
        return {r.uid: f"claim {describe(r)} is being unprepared; the kubelet will call "
                "again" for r in refs if r.uid in self._unpreparing}

    def join(self, refs: Iterable[ClaimRef]) -> list[Flight]:
        """The flight of each claim, started for those that have none; every flight joined
        must be left (:meth:`leave`)."""
        flights = []
        for ref in refs:
            flight = self._flights.get(ref.uid)
            if flight is None:
                hold = Hold()
                task = asyncio.get_running_loop().create_task(
                    self.start(ref, hold), name=f"prepare claim {ref.uid}")
                flight = self._flights[ref.uid] = Flight(ref, task, hold)
                task.add_done_callback(lambda _task, f=flight: self._landed(f))
            flight.callers += 1
            flights.append(flight)
        return flights

    @contextlib.contextmanager
    def touching(self, uids: list[str]) -> Iterator[None]:
        """Recorded claims a call is answering again (writing a spec a reboot took): no
        unprepare of them runs meanwhile."""
        _count(self._touching, uids, 1)
        try:
            yield
        finally:
            _count(self._touching, uids, -1)
            self._notify()

    async def answer(self, flights: Sequence[Flight], timeout: float | None,
                     deadline: float | None, results: dict[str, ClaimResult]) -> None:
        """Each flight's answer into ``results``, by ``deadline``: the claims still being
        prepared then are answered ``late``. Records the flights found ready."""
        running = {f.task for f in flights if not f.task.done()}
        if running:
            await asyncio.wait(running, timeout=_left(deadline))
        while True:
            changed = self._changed
            ready = [f for f in flights if f.ready()]
            if ready:
                await self._record(ready)
                continue
            elsewhere = [f for f in flights if f.answer is None and f.recording]
            left = _left(deadline)
            if not elsewhere or left == 0:
                break
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await changed.wait()
        for flight in flights:
            self._landed(flight)
            results[flight.ref.uid] = flight.answer or ClaimResult(
                error=late(flight.ref, timeout, self.loading()))

    def leave(self, flights: Iterable[Flight]) -> None:
        """The calls are over: a flight none waits for any more ends, what it reserved given
        back (it is cancelled if still going; a load it started goes on in the programmer)."""
        for flight in flights:
            flight.callers -= 1
            if flight.callers <= 0 and not flight.ended:
                flight.task.cancel()
                self._end(flight)

    async def _record(self, ready: list[Flight]) -> None:
        for flight in ready:
            flight.recording = True
        answers: dict[str, ClaimResult] = {}
        try:
            await self.record([f.task.result() for f in ready], answers)
        finally:  # cancelled half-way: another caller records what has no answer
            for flight in ready:
                flight.recording = False
                answer = answers.get(flight.ref.uid)
                if answer is not None and not flight.ended:
                    flight.answer = answer
                    self._end(flight)
            self._notify()

    def _landed(self, flight: Flight) -> None:
        """A flight's task is over: a refusal (or a bug) is every caller's answer at once,
        and what it reserved is given back."""
        task = flight.task
        if flight.ended or flight.answer is not None or not task.done():
            return
        if task.cancelled():
            flight.answer = ClaimResult(error=f"claim {describe(flight.ref)}: its preparation "
                                        "was stopped; the kubelet will call again")
        elif (exc := task.exception()) is not None:
            flight.answer = ClaimResult(error=failure(flight.ref, exc))
        else:
            return
        self._end(flight)

    def _end(self, flight: Flight) -> None:
        flight.ended = True
        flight.hold.release()
        if self._flights.get(flight.ref.uid) is flight:
            del self._flights[flight.ref.uid]
        self._notify()

    # -- unprepare -----------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def unpreparing(self, claims: Sequence[ClaimRef], timeout: float | None
                          ) -> AsyncIterator[tuple[list[ClaimRef], dict[str, str]]]:
        """``(claims no prepare is under way for, {UID: answer} of the others)``, once the
        prepares under way for them ended or ``timeout`` passed; until the block ends, no
        prepare of the claims yielded starts."""
        busy = self.in_flight
        await self._until(lambda: not any(r.uid in busy() for r in claims), at(timeout))
        going = busy()
        free = [r for r in claims if r.uid not in going]
        _count(self._unpreparing, [r.uid for r in free], 1)
        try:
            yield free, {r.uid: f"claim {describe(r)} is still being prepared after "
                         f"{timeout or 0:.0f} s; the kubelet's next call unprepares it once "
                         "that is over" for r in claims if r.uid in going}
        finally:
            _count(self._unpreparing, [r.uid for r in free], -1)
            self._notify()

    # -- waiting -------------------------------------------------------------------------

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _until(self, condition: Callable[[], bool], deadline: float | None) -> None:
        while not condition():
            changed = self._changed
            left = _left(deadline)
            if left == 0:
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await changed.wait()


def _count(counts: dict[str, int], uids: list[str], step: int) -> None:
    """Add ``step`` to each UID's count, dropping those that reach zero."""
    for uid in uids:
        count = counts.get(uid, 0) + step
        if count > 0:
            counts[uid] = count
        else:
            counts.pop(uid, None)


def at(timeout: float | None) -> float | None:
    """The loop time ``timeout`` seconds from now (None: no deadline)."""
    return None if timeout is None else asyncio.get_running_loop().time() + timeout


def _left(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    return max(0.0, deadline - asyncio.get_running_loop().time())


def failure(ref: ClaimRef, exc: BaseException) -> str:
    """A claim's answer when preparing it raised: a refusal says why; a bug says so."""
    if isinstance(exc, Refused):
        log.warning("refused to prepare claim %s: %s", describe(ref), exc)
        return str(exc)
    log.error("preparing claim %s failed", describe(ref), exc_info=exc)
    return (f"claim {describe(ref)}: internal error of the driver: {type(exc).__name__}: "
            f"{exc}")


def late(ref: ClaimRef, timeout: float | None, loading: Mapping[str, str]) -> str:
    """What a claim still being prepared at a call's deadline is answered."""
    what = loading.get(ref.uid)
    if what is not None:
        return (f"claim {describe(ref)}: still {what} after {timeout or 0:.0f} s; the load "
                "goes on, and the kubelet's next call finds it done or waits for it")
    return (f"claim {describe(ref)} could not be prepared within {timeout or 0:.0f} s "
            "(API server slow?); the kubelet will call again")
