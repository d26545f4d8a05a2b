"""What the DRA tests share: waiting for a cluster state, and the kubelet's slice wipe."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from compat_tests.apiserver import ApiServerEmulator
from compat_tests.apiserver.client import ApiClient
from plugin.serving.dra.checkpoint import ClaimCheckpoint
from plugin.serving.dra.driver import CHECKPOINT_FILE
from plugin.serving.dra.prepared import PreparedClaim

SETTLE = 15.0


async def until(condition: Callable[[], Any], what: str, timeout: float = SETTLE) -> float:
    """Seconds until ``condition()`` holds (polled every 5 ms); fails naming ``what``."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while not condition():
        if loop.time() - start > timeout:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(0.005)
    return loop.time() - start


def wiper(api: ApiServerEmulator) -> Callable[[str], Awaitable[None]]:
    """What a starting kubelet does to its node's slices: DeleteCollection by node, with
    the emulated server's credentials."""

    async def wipe(node: str) -> None:
        async with ApiClient(api.url, api.token, api.ca_file) as client:
            await client.delete("/apis/resource.k8s.io/v1/resourceslices",
                                fieldSelector=f"spec.nodeName={node}")

    return wipe


def recorded_claims(state_dir: Path) -> Mapping[str, PreparedClaim]:
    """The claims the driver's checkpoint in ``state_dir`` holds, read as a restart would."""
    return ClaimCheckpoint(state_dir / CHECKPOINT_FILE).claims
