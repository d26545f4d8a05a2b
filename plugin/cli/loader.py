"""``accelerator-device-plugin loader``: the privileged half of a node that programs FPGAs.

It leaves the pod's network first (:mod:`plugin.programming.remote.isolation`), before any
thread starts, then discovers the node's devices with the same backends and flags as
``serve``, builds the loaders the same flags choose, and answers the driver's requests on
its socket (:mod:`plugin.programming.remote.server`) until SIGTERM or SIGINT; a load under
way is finished first.
"""

from __future__ import annotations

import asyncio
import logging
import signal

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
    return asyncio.run(_serve(settings, backend))


async def _serve(settings: Settings, backend: Backend) -> int:
    from plugin.programming.library import ImageLibrary
    from plugin.programming.remote.server import LoaderService, serve_socket
    from plugin.programming.setup import loaders_for

    assert settings.loader_socket is not None
    service = LoaderService(lambda: list(backend.scan()), loaders_for(settings),
                            ImageLibrary(settings.image_library, settings.image_max_bytes),
                            require_digest=settings.require_image_digest)
    if settings.require_image_digest:
        log.info("loader: --require-image-digest: every image must be pinned by sha256")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await serve_socket(settings.loader_socket, settings.loader_allowed_uids, service,
                           stop)
    except OSError as exc:
        log.error("loader: cannot serve %s: %s", settings.loader_socket, exc)
        return 1
    log.info("loader: stopped")
    return 0
