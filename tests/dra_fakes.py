"""Shared fakes for the DRA driver's tests: an API server's claims, a node's pool."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from plugin.serving.cdi import device_name
from plugin.serving.dra.prepare import ClaimNotFound
from value_types.claims import AllocationResult, ClaimAllocation, ClaimRef

DRIVER = "fpga.b-com.com"
POOL = "node-1"
RESOURCE_KIND = "b-com.com/accelerator"
PCI = ["0000:5e:00.0", "0000:5e:00.1", "0000:86:00.0", "0000:86:00.1",
       "0000:af:00.0", "0000:af:00.1", "0000:d8:00.0", "0000:d8:00.1"]
NAMES = {f"fpga-{i}": pci for i, pci in enumerate(PCI)}
"""DRA device name -> internal ID, for a node of eight ports."""


def cdi_ids(device_id: str) -> list[str]:
    return [f"{RESOURCE_KIND}={device_name(device_id)}"]


def allocation(uid: str, *devices: str, name: str | None = None, request: str = "accel",
               driver: str = DRIVER, pool: str = POOL, allocated: bool = True,
               namespace: str = "ns") -> ClaimAllocation:
    """A claim as the API server would give it, allocated ``devices`` of ``pool``."""
    return ClaimAllocation(
        ClaimRef(namespace, name or f"claim-{uid}", uid), allocated,
        tuple(AllocationResult(request, driver, pool, d) for d in devices))


@dataclass
class FakeClaims:
    """``read_claim`` of an API server holding ``claims`` (by namespace/name)."""

    claims: dict[tuple[str, str], ClaimAllocation] = field(default_factory=dict)
    errors: dict[str, BaseException] = field(default_factory=dict)
    """Claim name -> what reading it raises."""
    delay: float = 0.0
    hang: set[str] = field(default_factory=set)
    """Claim names whose read never returns."""
    reads: list[str] = field(default_factory=list)
    in_flight: int = 0
    most_in_flight: int = 0
    cancelled: list[str] = field(default_factory=list)

    def add(self, *allocations: ClaimAllocation) -> FakeClaims:
        for a in allocations:
            self.claims[(a.ref.namespace, a.ref.name)] = a
        return self

    async def __call__(self, ref: ClaimRef) -> ClaimAllocation:
        self.reads.append(ref.name)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if ref.name in self.hang:
                await asyncio.Event().wait()
            if self.delay:
                await asyncio.sleep(self.delay)
            if ref.name in self.errors:
                raise self.errors[ref.name]
            try:
                return self.claims[(ref.namespace, ref.name)]
            except KeyError:
                raise ClaimNotFound(f"resourceclaims {ref.name!r} not found") from None
        except asyncio.CancelledError:
            self.cancelled.append(ref.name)
            raise
        finally:
            self.in_flight -= 1


def ref(uid: str, name: str | None = None, namespace: str = "ns") -> ClaimRef:
    return ClaimRef(namespace, name or f"claim-{uid}", uid)


def first(mapping: dict[str, Any]) -> Any:
    return next(iter(mapping.values()))
