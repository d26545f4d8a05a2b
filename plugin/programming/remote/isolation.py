"""The loader process gives up the network it never needs.

The loader container shares the pod's network namespace with the driver. At start the
loader moves into a network namespace of its own, empty but for a loopback interface that
is down (``unshare(CLONE_NEWNET)``, unshare(2); it needs CAP_SYS_ADMIN, which the
privileged container has), so nothing it runs (a vendor tool included: children inherit
the namespace) can reach the pod network or the API server. The unix socket it serves is
a pathname socket, found through the filesystem, not the network namespace (unix(7):
only abstract sockets belong to a network namespace), so the driver still reaches it.

It must run before any thread starts: a namespace is per thread, and only threads and
processes created afterwards inherit it.
"""

from __future__ import annotations

import ctypes
import os

CLONE_NEWNET = 0x40000000
"""``include/uapi/linux/sched.h``."""


def leave_network() -> str | None:
    """Move this process into an empty network namespace; None once done, else why not."""
    # The C library this interpreter already runs on (dlopen(NULL)): no search for it,
    # which would pull in ctypes.util and what it imports.
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        unshare = libc.unshare
    except AttributeError:
        return "the C library has no unshare"
    if unshare(CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        return f"unshare(CLONE_NEWNET) failed: {os.strerror(code)} (errno {code})"
    return None


def network_interfaces() -> list[str]:
    """The interfaces this process's network namespace has (``/proc/self/net/dev``)."""
    try:
        with open("/proc/thread-self/net/dev") as table:
            lines = table.read().splitlines()[2:]
    except OSError:
        return []
    return [line.split(":", 1)[0].strip() for line in lines]
