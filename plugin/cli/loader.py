"""``accelerator-device-plugin loader``: the privileged half of a node that programs FPGAs.

It leaves the pod's network first (:mod:`plugin.programming.remote.isolation`), before any
thread starts, then discovers the node's devices with the same backends and flags as
``serve``, builds the loaders the same flags choose, and answers the driver's requests on
its socket (:mod:`plugin.programming.remote.server`) until SIGTERM or SIGINT; a load under
way is finished first. It blocks (a thread per connection) and holds no event loop: asyncio,
and the ssl it imports, would be a third of its memory.
"""

from __future__ import annotations

import logging
import signal
import threading

from plugin.cli.config import Settings
from plugin.discovery.backends.base import Backend

log = logging.getLogger(__name__)


def run_loader(settings: Settings, backend: Backend) -> int:
    from plugin.programming.remote.isolation import leave_network, network_interfaces

    if settings.loader_network == "isolate":
        why_not = leave_network()
        if why_not is None:
            log.info("loader: in a network namespace of its own (interfaces: %s); no "
                     "network is reachable from here", ", ".join(network_interfaces())
                     or "none")
        else:
            log.warning("loader: could not leave the pod's network (%s); loading works, "
                        "but this process keeps the pod's network", why_not)
    else:
        log.info("loader: --loader-network keep: this process keeps the pod's network")
    return _serve(settings, backend)


def _serve(settings: Settings, backend: Backend) -> int:
    from plugin.programming.library import ImageLibrary
    from plugin.programming.remote.server import LoaderService, serve_socket
    from plugin.programming.setup import local_loaders

    assert settings.loader_socket is not None
    service = LoaderService(lambda: list(backend.scan()), local_loaders(settings),
                            ImageLibrary(settings.image_library, settings.image_max_bytes),
                            require_digest=settings.require_image_digest)
    if settings.require_image_digest:
        log.info("loader: --require-image-digest: every image must be pinned by sha256")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda _signum, _frame: stop.set())
    try:
        serve_socket(settings.loader_socket, settings.loader_allowed_uids, service, stop)
    except OSError as exc:
        log.error("loader: cannot serve %s: %s", settings.loader_socket, exc)
        return 1
    log.info("loader: stopped")
    return 0
