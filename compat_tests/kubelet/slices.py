"""The kubelet's ResourceSlice clean-up calls, against an (emulated) API server over HTTP.

A starting kubelet with DRA deletes every ResourceSlice of its node
(``DeleteCollection`` with field selector ``spec.nodeName=<node>``), and the slices of a
driver whose last plugin went away (``spec.nodeName=<node>,spec.driver=<driver>``), so a
driver must notice and publish again. The emulator takes these as async callables so tests
can hand it anything; this module builds them for a plain URL (``--apiserver``), with the
standard library in a worker thread. A server that is down or answers an error makes the call
raise, and the emulated kubelet retries with its backoff, as the real one does.
"""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Awaitable, Callable

WipeSlices = Callable[[str], Awaitable[None]]
"""``await wipe(node_name)``: delete every ResourceSlice of the node."""
WipeDriverSlices = Callable[[str, str], Awaitable[None]]
"""``await wipe(node_name, driver)``: delete the node's ResourceSlices of one driver."""

RESOURCE_SLICES = "/apis/resource.k8s.io/v1/resourceslices"
HTTP_TIMEOUT = 5.0


class WipeFailed(RuntimeError):
    """The API server could not be reached or refused the DeleteCollection."""


def delete_collection_url(base_url: str, node: str, driver: str | None = None) -> str:
    """The DeleteCollection URL the kubelet's client sends, e.g.
    ``{base}/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3Dnode-1``."""
    selector = f"spec.nodeName={node}"
    if driver is not None:
        selector += f",spec.driver={driver}"
    query = urllib.parse.urlencode({"fieldSelector": selector})
    return f"{base_url.rstrip('/')}{RESOURCE_SLICES}?{query}"


def _delete(url: str) -> None:
    request = urllib.request.Request(url, method="DELETE")
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT) as answer:
            answer.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:  # 1.34+: nothing to delete counts as done
            return
        raise WipeFailed(f"DELETE {url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise WipeFailed(f"DELETE {url}: {reason}") from None


def http_wiper(base_url: str) -> WipeSlices:
    """A ``wipe_slices`` callable that deletes the node's slices on the server at ``base_url``."""

    async def wipe(node: str) -> None:
        await asyncio.to_thread(_delete, delete_collection_url(base_url, node))

    return wipe


def http_driver_wiper(base_url: str) -> WipeDriverSlices:
    """A ``wipe_driver_slices`` callable for the server at ``base_url``."""

    async def wipe(node: str, driver: str) -> None:
        await asyncio.to_thread(_delete, delete_collection_url(base_url, node, driver))

    return wipe
