"""What the DRA driver knows of a ResourceClaim, whatever API version it was read through.

The kubelet's NodePrepareResources carries only a claim's namespace, name and UID; the
allocation comes from the API server, where resource.k8s.io v1, v1beta2 and v1beta1 spell it
alike (``status.allocation.devices.results[]``). The adapters in ``api_versions`` turn a claim
object of any version into these values, and everything in this package works on them, so no
wire shape leaks into the driver.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A claim as the kubelet names it in NodePrepareResources and NodeUnprepareResources."""

    namespace: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class AllocationResult:
    """One allocated device of a claim: ``request`` may be ``<request>/<subrequest>``."""

    request: str
    driver: str
    pool: str
    device: str


@dataclass(frozen=True, slots=True)
class DeviceConfig:
    """One opaque configuration of ``status.allocation.devices.config[]``: ``source`` is
    ``FromClass`` (the scheduler copied it from a DeviceClass) or ``FromClaim``; it applies to
    the ``requests`` named (``<request>`` covers its subrequests; empty: every request).
    ``parameters`` is the driver's own object, left as the API server stored it."""

    source: str
    requests: tuple[str, ...]
    driver: str
    parameters: object

    def applies_to(self, request: str) -> bool:
        """Whether this configuration applies to result ``request`` (``<r>`` or ``<r>/<s>``)."""
        if not self.requests:
            return True
        return request in self.requests or request.split("/", 1)[0] in self.requests


@dataclass(frozen=True, slots=True)
class ClaimAllocation:
    """A claim as read from the API server; ``results`` is empty when it is not allocated
    (``allocated`` tells the two apart from an allocation with no device of any driver)."""

    ref: ClaimRef
    allocated: bool
    results: tuple[AllocationResult, ...] = ()
    configs: tuple[DeviceConfig, ...] = ()
    """In the server's order: every DeviceClass's first, then the claim's, so a later entry
    overrides an earlier one for the same request."""
    classes: tuple[tuple[str, str], ...] = ()
    """(request or ``<request>/<subrequest>``, the DeviceClass its spec names): which class's
    catalogue a claim's own configuration answers to, and whom a refusal names."""
    reserved_for: tuple[str, ...] = ()
    """The pods ``status.reservedFor`` names (the consumers the audit records)."""

    def results_for(self, driver: str) -> tuple[AllocationResult, ...]:
        """The results this driver prepares; other drivers' devices are theirs."""
        return tuple(r for r in self.results if r.driver == driver)

    def configs_for(self, driver: str, request: str) -> tuple[DeviceConfig, ...]:
        """This driver's configurations that apply to result ``request``, in order."""
        return tuple(c for c in self.configs if c.driver == driver and c.applies_to(request))


@dataclass(frozen=True, slots=True)
class DeviceCondition:
    """One condition of an allocated device's status, as ``metav1.Condition`` spells it:
    ``status`` is ``True``, ``False`` or ``Unknown``; ``since`` (RFC 3339, seconds) changes
    only when ``status`` does, as ``lastTransitionTime`` must."""

    type: str
    status: str
    reason: str
    message: str
    since: str


@dataclass(frozen=True, slots=True)
class DeviceStatusReport:
    """What this driver says of one of its allocated devices in ``status.devices[]``
    (KEP-4817): ``data`` is the driver's own JSON object (PCI address, device nodes)."""

    driver: str
    pool: str
    device: str
    data: tuple[tuple[str, object], ...]
    """The data object's items, kept as pairs so the value stays hashable and comparable."""
    conditions: tuple[DeviceCondition, ...]
    share_id: str | None = None
