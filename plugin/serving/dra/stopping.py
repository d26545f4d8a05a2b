"""How the DRA driver stops: its claims' work finished before its socket is given up.

A rolling update's newcomer waits for the old instance's DRA socket (and its lock) and takes
over the moment it goes. Were the socket given up first, the newcomer would prepare claims
(and program cards, through its own loader) while the old one still wrote a card, or a clear
of the old one would land over a function the newcomer had just loaded. So, in this order:

1. no new claim is taken: every NodePrepareResources is answered, claim by claim, that this
   instance is stopping (the kubelet calls again and reaches the newcomer). Unprepare still
   works: the claim leaves the checkpoint, and its clear is recorded pending, left to the
   newcomer (:mod:`plugin.programming.clears`);
2. the loads and clears under way are waited for, up to ``--stop-timeout`` seconds; what is
   left then is cut off: a load that may have started leaves its device quarantined (its
   state is unknown), a clear stays pending for the newcomer;
3. only then the slices stop being published and the socket is removed.

``--stop-timeout`` must end before the pod's ``terminationGracePeriodSeconds``, after which
the kubelet kills the process: a kill leaves the same state (the quarantine and the pending
clear written before the load began), but says nothing in the log. The daemon does this
while discovery still runs, so a load that ends meanwhile is seen reported.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from plugin.programming.programmer import Programmer
    from plugin.serving.dra.prepare import ClaimPreparer

log = logging.getLogger(__name__)

DEFAULT_STOP_TIMEOUT = 25.0
"""Below the 30 s a pod's ``terminationGracePeriodSeconds`` defaults to."""


async def finish_work(preparer: ClaimPreparer | None, programmer: Programmer | None,
                      timeout: float) -> None:
    """Steps 1 and 2 of the module docstring (idempotent)."""
    if preparer is not None and not preparer.stopping:
        preparer.stopping = True
        log.info("stopping: no new claim is prepared from now on")
    if programmer is None:
        return
    programmer.clears.stop()
    busy = programmer.changing()
    if busy:
        log.info("stopping: waiting up to %g s for the loads and clears under way on %s "
                 "before giving up the driver's socket", timeout, ", ".join(sorted(busy)))
    await programmer.close(timeout)
