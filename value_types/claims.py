"""What the DRA driver knows of a ResourceClaim, whatever API version it was read through.

The kubelet's NodePrepareResources carries only a claim's namespace, name and UID; the
allocation comes from the API server, where resource.k8s.io v1, v1beta2 and v1beta1 spell it
alike (``status.allocation.devices.results[]``). The adapters in ``api_versions`` turn a claim
object of any version into these values, and the driver (``plugin.serving.dra``) works on
them, so no wire shape leaks into the driver.

What preparing a claim answers travels back the same way: a :class:`ClaimResult` of
:class:`PreparedDevice` values, which :mod:`api_versions.dra_plugin` turns into whichever
``NodePrepareResourceResponse`` the kubelet's service spells, and which the driver's
checkpoint keeps as JSON (``to_json``/``from_json``) so a repeated call answers alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
    share_id: str | None = None
    """The allocation's ``shareID`` (resource.k8s.io v1 1.34+, KEP-5075): set only when the
    device was published with ``allowMultipleAllocations`` and this result is one share of
    it; None: the device was allocated whole."""
    consumed_contexts: int | None = None
    """``consumedCapacity["contexts"]`` of a share, as the scheduler rounded it; None when
    the result carries none."""


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


def base_request(request: str) -> str:
    """``<request>`` of ``<request>/<subrequest>``: what a container names in
    ``resources.claims[].request``, and so what the kubelet matches ``request_names`` with
    (``slices.Contains`` on the name as is, 1.32-1.36). The Go helper strips the subrequest
    for the same reason (dra@v0.34.0 ``kubeletplugin/draplugin.go``,
    ``stripSubrequestNames``)."""
    return request.split("/", 1)[0]


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One allocated device of a prepared claim."""

    pool: str
    device: str
    """The DRA device name in the pool (what ResourceSlices and the allocation say)."""
    device_id: str
    """The internal device ID (a PCI address, a unit number) the DRA name stood for."""
    requests: tuple[str, ...]
    """The allocation's request names, ``<request>/<subrequest>`` kept, for the record."""
    cdi_ids: tuple[str, ...]
    """Fully qualified CDI device IDs (``vendor/class=name``) the runtime injects."""
    share_id: str | None = None
    """The allocation's ``shareID`` when the claim holds one share of the device (what the
    v1 response's ``Device.share_id`` and the claim status entry carry); None: whole."""
    contexts: int | None = None
    """The device's contexts the share holds (its consumed ``contexts``, 1 when the
    allocation names none); None for a device held whole."""

    @property
    def request_names(self) -> tuple[str, ...]:
        """What the kubelet gets in ``Device.request_names``: subrequests stripped."""
        return tuple(dict.fromkeys(base_request(r) for r in self.requests))

    def to_json(self) -> dict[str, Any]:
        """The checkpoint's device record; ``shareID`` and ``contexts`` only for a share, so
        a record without shares reads as it always did."""
        data: dict[str, Any] = {"pool": self.pool, "device": self.device,
                                "deviceID": self.device_id, "requests": list(self.requests),
                                "cdiDeviceIDs": list(self.cdi_ids)}
        if self.share_id is not None:
            data["shareID"] = self.share_id
        if self.contexts is not None:
            data["contexts"] = self.contexts
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PreparedDevice:
        share_id = data.get("shareID")
        if share_id is not None and (not isinstance(share_id, str) or not share_id):
            raise ValueError(f"'shareID' is not text: {share_id!r:.60}")
        contexts = data.get("contexts")
        if contexts is not None and (not isinstance(contexts, int) or
                                     isinstance(contexts, bool) or contexts < 1):
            raise ValueError(f"'contexts' is not a positive count: {contexts!r:.20}")
        return cls(pool=text_field(data, "pool"), device=text_field(data, "device"),
                   device_id=text_field(data, "deviceID"), requests=texts_field(data, "requests"),
                   cdi_ids=texts_field(data, "cdiDeviceIDs"), share_id=share_id,
                   contexts=contexts)


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """The answer for one claim of a NodePrepareResources call: devices, or why not.

    A non-empty ``error`` fails that claim only; the kubelet reports it on the pod and calls
    again later. ``devices`` is then ignored."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error


def text_field(data: dict[str, Any], key: str) -> str:
    """``data[key]`` as text, or ValueError naming the key (checkpoint records)."""
    value = data.get(key)
    if not isinstance(value, str):
        raise ValueError(f"{key!r} is not text: {value!r:.60}")
    return value


def texts_field(data: dict[str, Any], key: str) -> tuple[str, ...]:
    """``data[key]`` as a tuple of text (absent: empty), or ValueError naming the key."""
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{key!r} is not a list of text")
    return tuple(value)
