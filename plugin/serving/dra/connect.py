"""The DRA driver's API client, made once its configuration can be read."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from plugin.serving.dra.apiserver import ApiRefused, ApiServer

log = logging.getLogger(__name__)

CONNECT_RETRY_INITIAL = 0.2
CONNECT_RETRY_MAX = 30.0


async def connect(kubeconfig: Path | None, request_timeout: float, driver: str) -> ApiServer:
    """The API client, once its configuration can be read: a kubeconfig or service account
    that is missing or broken is said once and tried again with back-off, not raised into
    the supervisor at every try (a traceback each time)."""
    delay, said = CONNECT_RETRY_INITIAL, None
    while True:
        try:
            api = ApiServer.connect(kubeconfig, request_timeout)
        except ApiRefused as refusal:
            if str(refusal) != said:
                log.error("DRA driver %s: %s; trying again with back-off, up to every %g s",
                          driver, refusal, CONNECT_RETRY_MAX)
                said = str(refusal)
            await asyncio.sleep(delay)
            delay = min(delay * 2, CONNECT_RETRY_MAX)
            continue
        if said is not None:
            log.info("DRA driver %s: the API server configuration can be read now", driver)
        return api
