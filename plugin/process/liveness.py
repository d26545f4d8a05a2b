"""What the serve loops last proved about themselves, readable from any thread.

The daemon's heartbeat loop runs a real gRPC call over every socket it serves (the
self-check) on the event loop, every ``--heartbeat-interval``. Its outcome is what liveness
means here: the loop that serves the kubelet turned, and every socket answered. The file
``healthcheck`` reads has always recorded the same thing; :class:`Heartbeat` keeps it in
memory as well, for ``/livez``.

``/livez`` is answered on a thread of its own, not on the event loop: a wedged loop must
turn the answer to 503, which a loop that no longer runs could not say. So the loop writes
one immutable record per round (a single reference assignment, atomic in Python) and the
probe thread only reads it, with no lock that a stuck loop could hold.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    """A probe's answer: 200 or 503, and a short reason for a person reading it."""

    ok: bool
    why: str


@dataclass(frozen=True)
class _Round:
    at: float
    failed: tuple[str, ...]


class Heartbeat:
    """The last self-check round, and whether it is recent enough to vouch for the loop."""

    def __init__(self, max_age: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_age = max_age
        self._clock = clock
        # Start-up counts as a passed round: a loop that never turns is stale after max_age.
        self._latest = _Round(clock(), ())

    def record(self, failed: Sequence[str]) -> None:
        """A round ended; ``failed`` names what did not answer (empty: all did)."""
        self._latest = _Round(self._clock(), tuple(failed))

    def verdict(self) -> Verdict:
        """Live when the latest round passed and ended within ``max_age`` (any thread)."""
        latest = self._latest
        age = max(0.0, self._clock() - latest.at)
        if latest.failed:
            return Verdict(False, f"self-check failed {age:.1f} s ago: "
                                  f"{', '.join(latest.failed)} did not answer on its socket")
        if age > self.max_age:
            return Verdict(False, f"no self-check for {age:.0f} s (limit {self.max_age:g} s): "
                                  "the event loop or a self-check is stuck")
        return Verdict(True, f"self-check passed {age:.1f} s ago")
