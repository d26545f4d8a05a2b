"""The device manager's plugin clients of each resource, under one kubelet version's rules.

What happens when a resource is registered again while its previous plugin still streams is
where kubelet versions differ most, and it is what a rolling update of a plugin meets:

* before 1.25 (``pkg/kubelet/cm/devicemanager/manager.go``): the new endpoint replaces the
  old one, which is stopped; an endpoint's stream end counts only while it is the current one
  (``runEndpoint`` checks ``old.e == e`` before marking the resource unhealthy);
* 1.25 to 1.35 (``pkg/kubelet/cm/devicemanager/plugin/v1beta1/handler.go``): ``clients`` is a
  map keyed by resource name. ``registerClient`` overwrites the entry and leaves the old
  client running, its ListAndWatch lists still reaching the manager by resource name. When a
  client's stream ends, ``runClient`` looks up ``getClient(name)``, which by then is the
  newest client, and ``disconnectClient`` closes it and calls ``PluginDisconnected``, which
  marks the resource's devices unhealthy: the old instance's stream end drops the new one;
* 1.36 on (kubernetes#135437): ``clients[name]`` is a list and lookups match the socket path
  too, so the ended client disconnects itself; ``PluginDisconnected`` still takes only the
  resource name and marks its devices unhealthy while any endpoint is registered under it,
  so an old stream ending after a new registration still zeroes the resource until the new
  plugin sends another list.

Either way a plugin instance that registers before its predecessor's stream has ended, and
been seen to end by the kubelet, is undone by it. In every version the kubelet closes its
connection to a plugin whose stream ended (``e.stop()`` before 1.25, ``client.Disconnect``
since): a plugin can tell that the kubelet has handled its stream's end.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum

from compat_tests.kubelet.endpoint import PluginEndpoint
from compat_tests.kubelet.models import StreamEnd
from compat_tests.kubelet.results import UNHEALTHY, EmulatedDevice

_CLIENTS_BY_NAME_SINCE = 25
_CLIENTS_BY_SOCKET_SINCE = 36


@dataclass(frozen=True)
class Moment:
    at: float
    """``time.perf_counter()`` in the emulator's process."""
    endpoint: PluginEndpoint
    healthy: int | None
    """Healthy devices in a list heard; None: the stream ended."""


class Rules(Enum):
    STOP_REPLACED = "stop-replaced"
    LAST_BY_NAME = "last-by-name"
    BY_SOCKET = "by-socket"


def rules_for(minor: int) -> Rules:
    if minor >= _CLIENTS_BY_SOCKET_SINCE:
        return Rules.BY_SOCKET
    if minor >= _CLIENTS_BY_NAME_SINCE:
        return Rules.LAST_BY_NAME
    return Rules.STOP_REPLACED


class Clients:
    """Which client is each resource's plugin, and which older ones still run beside it."""

    def __init__(self, rules: Rules) -> None:
        self.rules = rules
        self.current: dict[str, PluginEndpoint] = {}
        self._older: dict[str, list[PluginEndpoint]] = {}
        self.dropped_by_older: list[PluginEndpoint] = []
        """Current clients undone by an older client's stream end, in order."""
        self.timeline: list[Moment] = []
        """Every list heard and every stream end, in order (for benchmarks)."""

    def install(self, endpoint: PluginEndpoint) -> PluginEndpoint | None:
        """Make ``endpoint`` the resource's client; return an old one to stop now, if any."""
        name = endpoint.resource_name
        old = self.current.get(name)
        self.current[name] = endpoint
        if old is None or self.rules is Rules.STOP_REPLACED:
            return old
        self._older.setdefault(name, []).append(old)
        return None

    def feeds(self, endpoint: PluginEndpoint, devices: dict[str, EmulatedDevice]) -> bool:
        """Whether a list on ``endpoint``'s stream reaches the manager (noted if it does)."""
        heard = self.current.get(endpoint.resource_name) is endpoint or \
            endpoint in self._older.get(endpoint.resource_name, [])
        if heard:
            healthy = sum(d.healthy for d in devices.values())
            self.timeline.append(Moment(time.perf_counter(), endpoint, healthy))
        return heard

    def ended(self, endpoint: PluginEndpoint) -> tuple[bool, PluginEndpoint | None]:
        """``endpoint``'s stream ended: whether the resource's devices go (unhealthy or
        dropped), and a current client the kubelet disconnects because of it."""
        name = endpoint.resource_name
        self.timeline.append(Moment(time.perf_counter(), endpoint, None))
        if self.current.get(name) is endpoint:
            del self.current[name]
            return True, None
        older = self._older.get(name, [])
        if endpoint not in older:
            return False, None
        older.remove(endpoint)
        if self.rules is Rules.LAST_BY_NAME:
            newest = self.current.pop(name, None)
            if newest is not None:
                self.dropped_by_older.append(newest)
            return newest is not None, newest
        return name in self.current, None

    def clear(self) -> list[PluginEndpoint]:
        """Forget every client (the kubelet goes down); return them all, to close."""
        every = [*self.current.values(), *(e for old in self._older.values() for e in old)]
        self.current.clear()
        self._older.clear()
        return every


Devices = dict[str, dict[str, EmulatedDevice]]


def without_devices(devices: Devices, name: str, stream_end: StreamEnd) -> tuple[Devices, str]:
    """The kubelet's devices once ``name``'s plugin is gone, and what became of them."""
    if stream_end is StreamEnd.DROP:
        return {n: d for n, d in devices.items() if n != name}, "devices dropped"
    marked = {i: EmulatedDevice(d.id, UNHEALTHY, d.numa_nodes)
              for i, d in devices.get(name, {}).items()}
    return {**devices, name: marked}, "devices marked unhealthy"
