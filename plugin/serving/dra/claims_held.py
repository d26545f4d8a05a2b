"""Which claims this driver prepared may still have running pods, as the API server tells.

After the node moves back to the device plugin, the kubelet no longer calls unprepare for the
claims the DRA driver prepared, so their devices stay held until the API server says each
claim is gone, replaced (another UID), or reserved for no pod; where the server cannot tell
(refused, down, slow), the claim still holds its devices: releasing them then could hand a
device out twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from plugin.serving.dra.apiserver import ApiServer, NotFound
from plugin.serving.dra.prepared import PreparedClaim
from value_types.claims import ClaimRef

CLAIM_CHECK_TIMEOUT = 2.0
"""How long the API server may take to say whether a recorded claim still holds its devices
(the node moving back to the device plugin waits for it): beyond, the claim counts as held."""
CLAIM_CHECK_CONCURRENCY = 32


async def claim_in_use(api: ApiServer, ref: ClaimRef) -> bool:
    """Whether claim ``ref`` (by UID) is still allocated and reserved for a pod."""
    try:
        obj = await api.get_claim(ref.namespace, ref.name)
    except NotFound as failure:
        # Gone only when the claim is: a version the server stopped serving says nothing of
        # the claim, and releasing its devices then could hand them out twice.
        return failure.unserved
    except Exception:  # refused, down, an answer it cannot read: the device stays held
        return True
    if ref.uid and obj.get("metadata", {}).get("uid") not in (None, ref.uid):
        return False
    status = obj.get("status") or {}
    return bool(status.get("allocation")) and bool(status.get("reservedFor"))


async def live_claims(api: ApiServer | None, recorded: Iterable[PreparedClaim], node: str
                      ) -> list[tuple[str, str, list[str]]]:
    """(namespace, name, device IDs of this node's pool) of each recorded claim that may
    still have running pods; without an API server, every one."""
    claims = list(recorded)
    reads = asyncio.Semaphore(CLAIM_CHECK_CONCURRENCY)

    async def in_use(ref: ClaimRef) -> bool:
        if api is None:
            return True
        try:
            async with reads, asyncio.timeout(CLAIM_CHECK_TIMEOUT):  # queued: no clock
                return await claim_in_use(api, ref)
        except TimeoutError:
            return True  # the server is slow to tell: the claim still holds its devices

    answers = await asyncio.gather(*(in_use(claim.ref) for claim in claims))
    return [(claim.ref.namespace, claim.ref.name,
             [d.device_id for d in claim.devices if d.pool == node])
            for claim, used in zip(claims, answers, strict=True) if used]
