"""Plain values the emulated DRA manager hands to tests, whatever wire a kubelet release used.

Tests of a DRA driver ask what the kubelet saw: which service it picked, what each claim
came back with, which health it heard, whether the node's slices were wiped. These frozen
shapes carry exactly that and no protobuf type.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ClaimRef:
    """A ResourceClaim as the kubelet knows it when preparing a pod: namespace, name, UID,
    plus the drivers named in its allocation results (the kubelet reads those from the claim;
    the driver receives only namespace, UID and name)."""

    namespace: str
    name: str
    uid: str
    drivers: tuple[str, ...]


@dataclass(frozen=True)
class PreparedDevice:
    """One ``Device`` of a NodePrepareResources answer, as the kubelet keeps it."""

    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None
    """1.35+ kubelets on v1 only; None where unset or not read."""


@dataclass(frozen=True)
class ClaimResult:
    """What one driver answered for one claim."""

    claim: ClaimRef
    driver: str
    answered: bool
    """Whether the response map had an entry for the claim's UID."""
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""
    """The driver's per-claim error (the entry's ``error`` field)."""
    skipped: bool = False
    """Not sent: already prepared (prepare) or not prepared at all (unprepare)."""

    @property
    def ok(self) -> bool:
        return self.answered and not self.error


@dataclass(frozen=True)
class DriverCall:
    """One NodePrepareResources / NodeUnprepareResources call the kubelet made."""

    driver: str
    endpoint: str
    path: str
    claim_uids: tuple[str, ...]
    error: str | None = None
    """The RPC's error as a Go kubelet prints it; None when the call returned."""


@dataclass(frozen=True)
class ClaimsOutcome:
    """The result of one ``prepare`` or ``unprepare``: per-claim results, and the kubelet's
    own error for the whole operation (None when every claim succeeded)."""

    results: tuple[ClaimResult, ...]
    calls: tuple[DriverCall, ...]
    error: str | None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def missing(self) -> tuple[str, ...]:
        """UIDs of claims sent but left out of the response map: the kubelet calls again."""
        return tuple(r.claim.uid for r in self.results if not r.answered and not r.skipped)

    def result(self, uid: str, driver: str | None = None) -> ClaimResult:
        """The result for claim ``uid`` (and ``driver`` when the claim has several)."""
        for result in self.results:
            if result.claim.uid == uid and driver in (None, result.driver):
                return result
        raise KeyError(f"no result for claim {uid}" + (f" and driver {driver}" if driver else ""))

    def cdi_ids(self, uid: str) -> tuple[str, ...]:
        """Every CDI device ID the claim's devices carry, in the order they came."""
        return tuple(i for r in self.results if r.claim.uid == uid
                     for d in r.devices for i in d.cdi_device_ids)


@dataclass(frozen=True)
class DraRegistration:
    """One DRA registration the kubelet's handler decided on, accepted or not."""

    driver: str
    endpoint: str
    """The socket the kubelet dials: PluginInfo.endpoint, or the registration socket if empty."""
    socket: str
    supported_versions: tuple[str, ...]
    service: str | None
    """The service the kubelet picked (``"v1.DRAPlugin"``...); None when refused."""
    accepted: bool
    error: str | None = None
    """The handler's error (the plugin manager adds its ``RegisterPlugin error --`` prefix)."""
    version: str | None = None
    """1.31: the semver that won."""
    replaced: str | None = None
    """1.31-1.32: the endpoint of the instance this registration replaced."""


@dataclass(frozen=True)
class DeviceHealthRecord:
    """One device of a NodeWatchResources message, as the kubelet reads it."""

    pool_name: str
    device_name: str
    health: str
    """``Healthy``, ``Unhealthy`` or ``Unknown`` (the kubelet's names for the enum)."""
    last_updated: int
    timeout_seconds: int | None = None
    """1.35+; None where the kubelet does not read the field."""
    message: str | None = None
    """1.36+; None where the kubelet does not read the field."""


@dataclass(frozen=True)
class HealthUpdate:
    """One NodeWatchResources message: the driver's complete device list at that moment."""

    driver: str
    endpoint: str
    devices: tuple[DeviceHealthRecord, ...]
    service: str = "v1alpha1.DRAResourceHealth"
    """The health service the message came through (``v1.DRAResourceHealth`` 1.37+)."""


@dataclass(frozen=True)
class HealthAttempt:
    """One NodeWatchResources stream the kubelet opened, and how it ended."""

    driver: str
    endpoint: str
    messages: int
    ended: str
    """``"EOF"``, a Go-style gRPC error (``rpc error: code = Unimplemented desc = ...``) or
    ``"cancelled"`` when the kubelet closed it (deregistration, stop)."""
    code: str | None = None
    """The gRPC status code name when the stream failed (``UNIMPLEMENTED``...)."""
    service: str = "v1alpha1.DRAResourceHealth"
    """The health service the stream was opened on."""


@dataclass(frozen=True)
class SliceWipe:
    """One DeleteCollection of ResourceSlices the kubelet attempted."""

    node: str
    driver: str | None
    """None at kubelet start (every driver's slices on the node)."""
    ok: bool
    error: str | None = None
    attempt: int = 1


@dataclass
class ClaimInfo:
    """The kubelet's claim-info cache entry (what its checkpoint holds)."""

    claim: ClaimRef
    prepared: bool = False
    devices: dict[str, tuple[PreparedDevice, ...]] = field(default_factory=dict)
    """Per driver."""


@dataclass
class ClaimCheckpoint:
    """The kubelet's DRA checkpoint: survives a kubelet restart when handed to the next one."""

    claims: dict[tuple[str, str], ClaimInfo] = field(default_factory=dict)
    """Keyed by (namespace, name), as the kubelet's claim-info cache is."""

    def get(self, claim: ClaimRef) -> ClaimInfo | None:
        return self.claims.get((claim.namespace, claim.name))

    def prepared_uids(self) -> set[str]:
        return {info.claim.uid for info in self.claims.values() if info.prepared}
