"""Handing a resource's socket to the next instance with no more gap than the kubelet needs.

A rolling update (``maxSurge: 1``) leaves a window in which the kubelet holds the resource's
devices as unhealthy (node allocatable 0): from the old instance's ListAndWatch stream ending
to the new instance's first list. The new instance must not register before the kubelet has
handled that end. In ``pkg/kubelet/cm/devicemanager/plugin/v1beta1/handler.go`` (1.25 on),
``runClient`` waits for the client's stream to end, then disconnects ``getClient(name)``:
before kubernetes#135437 that is whichever client is registered under the resource name by
then, so a newcomer registered earlier is disconnected and its devices marked unhealthy;
after it, ``PluginDisconnected(name)`` still marks the resource unhealthy. So the floor is:
register the instant the kubelet has handled the old stream's end.

The kubelet says so itself: in every version it closes its connection to a plugin once that
plugin's stream has ended and been handled (``e.stop()`` after ``e.run()`` before 1.25;
``disconnectClient`` -> ``client.Disconnect`` -> ``grpc.Close`` in ``handler.go`` since; the
device marking follows within the same call, microseconds, well before a newcomer's Register,
dial-back and options round trip). The old instance therefore removes its socket only once
the kubelet's connections to it are gone (:func:`kubelet_released`), and the newcomer,
woken by that removal through inotify, registers at once. An old instance of a release
without this order gives no such promise; the newcomer asks (:func:`hands_over_in_order`,
a gRPC health check of :data:`ORDERED_HANDOVER`) and keeps a pause before registering for
those.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

log = logging.getLogger(__name__)

ORDERED_HANDOVER = "b-com.com/ordered-handover"
"""A health-service name an instance answers SERVING for when it removes its socket only
after the kubelet has dropped its connections (old releases answer NOT_FOUND)."""

RELEASE_POLL = 0.002
"""How often the stopping instance reads ``/proc/net/unix`` (a few µs each)."""

_CONNECTED = "03"


def connections_into(bound: str) -> int | None:
    """Open connections accepted by our listener bound at ``bound`` (None: cannot tell).

    An accepted unix socket carries its listener's address, and ``/proc/net/unix`` lists
    the sockets of this network namespace (where the plugin's listener and its accepted
    ends live) with their state and the path they were bound at (before any rename).
    """
    wanted = "/" + bound.lstrip("/")  # gRPC binds "unix:///p" as "///p"
    try:
        with open("/proc/net/unix") as table:
            next(table, None)
            return sum(1 for line in table
                       if (parts := line.split()) and len(parts) >= 8
                       and parts[5] == _CONNECTED and "/" + parts[7].lstrip("/") == wanted)
    except OSError:
        return None


async def kubelet_released(bound: str, timeout: float) -> bool:
    """Wait until no connection into ``bound`` remains, at most ``timeout`` seconds.

    Called with the ListAndWatch streams ending (the feed closed) and the gRPC server still
    up: the server's own stop would close the connections itself and prove nothing.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        left = connections_into(bound)
        if left is None or left == 0:
            return left == 0
        if loop.time() >= deadline:
            log.info("the kubelet still had %d connection(s) open after %.1f s; removing the "
                     "socket anyway", left, timeout)
            return False
        await asyncio.sleep(RELEASE_POLL)


async def hands_over_in_order(path: Path, timeout: float = 0.5) -> bool:
    """Whether the instance serving ``path`` promises the order above (False if unsure)."""
    try:
        async with grpc.aio.insecure_channel(f"unix://{path.absolute()}") as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=ORDERED_HANDOVER), timeout=timeout)
    except grpc.aio.AioRpcError:
        return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING
