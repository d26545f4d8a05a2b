"""How patient a :class:`~plugin.serving.deviceplugin.server.ResourceServer` is.

A value type of its own, importing none of the package's modules: the server and each of
its parts (socket, kubelet-socket hold, watcher hold) read it, so living in any of them
would make the others import their own composer.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Timing:
    """How patient the server is; defaults suit a real node, tests shorten them."""

    round_backoff_initial: float = 0.5
    round_backoff_max: float = 30.0
    confirm_timeout: float = 2.0
    stop_grace: float = 0.05
    holder_poll: float = 0.25
    """How often a server waiting for another process's socket checks that it is still live."""
    holder_reminder: float = 300.0
    """How often a server still waiting says so again (a plugin left running for hours)."""
    handover_settle: float = 0.1
    """Pause between taking over a socket and registering, so the kubelet has processed the
    previous holder's stream end first (kubelets before kubernetes#135437 drop a newer
    registration of the same resource when the older stream's end is handled after it).
    Skipped after a holder that removed its socket only once the kubelet had handled that
    end (see :mod:`plugin.serving.deviceplugin.handover`)."""
    release_wait: float = 1.0
    """How long a stopping instance waits for the kubelet to drop its connections (after
    its streams ended) before removing its socket anyway."""
    watcher_wait: float = 5.0
    """How long ``auto`` waits for a kubelet to register the watcher socket (its plugin
    manager reconciles every second) before registering through ``kubelet.sock``."""
