"""Device health for the kubelet's NodeWatchResources streams (KEP-4680, 1.34+).

The kubelet opens one stream per registered driver and expects, each time, the complete list
of the driver's devices with their health; it keeps what it heard as fresh for
``health_check_timeout_seconds`` (30 s when unset, and on 1.34 which does not read the field)
and then shows the device as Unknown on the pod. So the list goes out when a stream opens,
on every change of the devices, and again every ``resend_every`` seconds while nothing
changes (k8s.io/kubernetes ``pkg/kubelet/cm/dra/healthinfo.go``: the kubelet stamps each
report on receipt and times out on that stamp).

Health is never reported better than known: a device the pool names but discovery does not
have, or whose health is only the discovery watchdog's verdict (discovery stalled, so the
device's own health is not being read), is UNKNOWN, never HEALTHY.

Shares of a device (KEP-5075) need nothing of their own here: the stream's entries are keyed
by pool and device only (``DeviceIdentifier`` has no share ID, v1 and v1alpha1 alike), and the
kubelet applies a device's health to every container whose claim names that device
(``healthinfo.go`` keys by driver, pool and device), so one entry per device reaches every
share of it. The claims' own status entries, one per share, say the same health
(:mod:`.claim_status`).

One follower task per broadcaster turns feed changes into versions; any number of streams
wait on it, each getting the newest list (a slow stream skips states, never lags behind).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping

from plugin.model.feed import DeviceFeed
from value_types.devices import Device
from value_types.health import DeviceHealthReport, HealthState

log = logging.getLogger(__name__)

STALL_REASON = "device discovery stalled"
"""How :mod:`plugin.discovery.monitor` begins the reason it gives every device while a scan is
stuck: the device plugin can only say Unhealthy, DRA can say Unknown."""
DEFAULT_TIMEOUT_SECONDS = 30
DEFAULT_RESEND_EVERY = 10.0
MAX_MESSAGE = 1024
"""The kubelet keeps at most this many characters of a message (1.36)."""


def health_of(device: Device | None) -> tuple[HealthState, str]:
    """The DRA health of an internal device (None: discovery does not have it)."""
    if device is None:
        return HealthState.UNKNOWN, "device not found by discovery on this node"
    if device.healthy:
        return HealthState.HEALTHY, ""
    reason = device.health_reason
    if reason.startswith(STALL_REASON):
        return HealthState.UNKNOWN, reason[:MAX_MESSAGE]
    return HealthState.UNHEALTHY, (reason or "unhealthy")[:MAX_MESSAGE]


class HealthBroadcaster:
    """The health of pool ``pool_name``'s devices, for every NodeWatchResources stream.

    ``device_names()`` maps each DRA device name of the pool to its internal device ID, as
    published now; call :meth:`refresh` when it changes without the feed changing.
    """

    def __init__(self, pool_name: str, feed: DeviceFeed,
                 device_names: Callable[[], Mapping[str, str]], *,
                 timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS,
                 resend_every: float = DEFAULT_RESEND_EVERY,
                 clock: Callable[[], float] = time.time) -> None:
        if not 0 < resend_every < timeout_seconds:
            raise ValueError(f"resend_every ({resend_every:g} s) must be positive and shorter "
                             f"than timeout_seconds ({timeout_seconds} s), or the kubelet "
                             "would see every device go Unknown between messages")
        self.pool_name = pool_name
        self.feed = feed
        self.timeout_seconds = timeout_seconds
        self.resend_every = resend_every
        self._device_names = device_names
        self._clock = clock
        self._version = 0
        self._closed = False
        self._changed = asyncio.Condition()
        self._follower: asyncio.Task[None] | None = None
        self.streams = 0
        """Streams open now."""

    def current(self) -> tuple[DeviceHealthReport, ...]:
        """The complete list now, by device name."""
        devices = self.feed.current
        now = int(self._clock())
        names = self._device_names()
        reports = []
        for name in sorted(names):
            state, message = health_of(devices.get(names[name]))
            reports.append(DeviceHealthReport(self.pool_name, name, state, now,
                                              self.timeout_seconds, message))
        return tuple(reports)

    async def watch(self) -> AsyncIterator[tuple[DeviceHealthReport, ...]]:
        """The list now, then on every change, and every ``resend_every`` seconds without
        one; ends when the broadcaster closes (or the feed does)."""
        self._follow()
        self.streams += 1
        loop = asyncio.get_running_loop()
        try:
            seen = self._version
            last = self.current()
            sent_at = loop.time()
            yield last
            while not self._closed:
                due = sent_at + self.resend_every - loop.time()
                async with self._changed:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(
                            self._changed.wait_for(lambda seen=seen: self._version != seen
                                                   or self._closed), max(due, 0))
                if self._closed:
                    return
                seen = self._version
                reports = self.current()
                if _same_states(reports, last) and loop.time() - sent_at < self.resend_every:
                    continue  # a change that left every device's health as it was
                last, sent_at = reports, loop.time()
                yield reports
        finally:
            self.streams -= 1

    async def refresh(self) -> None:
        """The pool's device names changed: send every stream the new list."""
        async with self._changed:
            self._version += 1
            self._changed.notify_all()

    async def close(self) -> None:
        """End every stream (the service stops); the kubelet retries on its own."""
        follower, self._follower = self._follower, None
        if follower is not None:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower
        async with self._changed:
            self._closed = True
            self._changed.notify_all()

    def _follow(self) -> None:
        if self._follower is None and not self._closed:
            self._follower = asyncio.create_task(self._follow_feed(),
                                                 name=f"DRA health of pool {self.pool_name}")

    async def _follow_feed(self) -> None:
        async for _ in self.feed.subscribe():
            await self.refresh()
        log.info("device feed closed: ending the health streams of pool %s", self.pool_name)
        async with self._changed:
            self._closed = True
            self._changed.notify_all()


def _same_states(a: tuple[DeviceHealthReport, ...], b: tuple[DeviceHealthReport, ...]) -> bool:
    return [(r.device, r.state, r.message) for r in a] == [(r.device, r.state, r.message)
                                                            for r in b]
