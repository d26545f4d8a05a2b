"""What each emulated API server release (1.32 .. 1.38) serves, as data rather than branches.

Everything in which two kube-apiserver releases differ for a node-local DRA driver is looked up
here: which resource.k8s.io versions are compiled in and served by default (k/k
``pkg/controlplane/instance.go`` per release), feature-gate defaults that make the server drop
fields silently (k/k ``pkg/features/versioned_kube_features.go``), the fields a release does not
know at all (so a strict decoder rejects them as unknown; derived from the json tags of
k8s.io/api ``resource/*/types.go`` at v0.32.0 .. v0.37.0-beta.0) and the taint effects it accepts.

The OpenAPI schemas shipped with the emulator are those of a 1.36 server (read by 1.32 .. 1.36)
and of a 1.37 one (read by 1.37 and 1.38; ``openapi/1.37/README.md`` says how they were made); an
older model removes the fields listed in ``FIELD_SINCE`` from them, which is how the older server
would see them.

1.37 and 1.38 (the project's DRA facts page, section 7: the 1.37 DRA blog post and the
website's feature-gate pages): 1.37 serves v1, v1beta2 and v1beta1 (v1alpha3 is gone) with
device taints, claim device status and DRA extended resources GA, the last two locked on; 1.38
no longer serves v1beta1 (deprecated in 1.35), locks device taints on and drops the
DynamicResourceAllocation gate (GA since 1.34). No 1.38 source is in reach: its model is 1.37's
with those three changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

FIRST_MINOR = 32
LAST_MINOR = 38
DEFAULT_MODEL = "1.36"
GROUP = "resource.k8s.io"

SCHEMA_VERSIONS = ("v1", "v1beta2", "v1beta1")
"""Versions this emulator can serve (those with an OpenAPI schema), newest first."""

UNMODELLED_VERSIONS = ("v1alpha3",)
"""Compiled into 1.32 .. 1.36 servers but not emulated: no schema of it ships here."""

_PRIORITY = ("v1", "v1beta2", "v1beta1", "v1alpha3")


def _compiled(minor: int) -> tuple[str, ...]:
    if minor == 32:
        return ("v1beta1", "v1alpha3")
    if minor == 33:
        return ("v1beta2", "v1beta1", "v1alpha3")
    if minor <= 36:
        return ("v1", "v1beta2", "v1beta1", "v1alpha3")
    if minor == 37:
        return ("v1", "v1beta2", "v1beta1")
    return ("v1", "v1beta2")  # v1beta1 is not served from 1.38


def _served_by_default(minor: int) -> tuple[str, ...]:
    # DRA was beta and off by default before 1.34; GA in 1.34 serves v1 only.
    return () if minor < 34 else ("v1",)


GATES: dict[str, tuple[tuple[int, bool], ...]] = {
    # name: ((first minor of a stage, default from then on), ...)
    "DRAAdminAccess": ((32, False), (34, True)),
    "DRAConsumableCapacity": ((34, False), (36, True)),
    "DRADeviceBindingConditions": ((34, False), (36, True)),
    "DRADeviceTaints": ((33, False), (36, True)),
    "DRAExtendedResource": ((34, False), (36, True)),
    "DRAListTypeAttributes": ((36, False),),
    "DRANodeAllocatableResources": ((36, False),),
    "DRAPartitionableDevices": ((33, False), (36, True)),
    "DRAPrioritizedList": ((33, False), (34, True)),
    "DRAResourceClaimDeviceStatus": ((32, False), (33, True)),
    "DRAResourceClaimGranularStatusAuthorization": ((36, True),),
    "DynamicResourceAllocation": ((32, False), (34, True)),
}
"""Feature gates whose state changes what the server stores (k/k versioned_kube_features.go)."""

LOCKED_SINCE: dict[str, int] = {
    "DRAExtendedResource": 37,
    "DRAResourceClaimDeviceStatus": 37,
    "DRADeviceTaints": 38,
}
"""GA gates locked to their default from that minor: setting them otherwise stops the server."""

REMOVED_SINCE: dict[str, int] = {"DynamicResourceAllocation": 38}
"""Gates the server no longer knows from that minor (``unrecognized feature gate``)."""

SCHEMA_RELEASE_SINCE: tuple[tuple[int, str], ...] = ((32, "1.36"), (37, "1.37"))
"""(first minor, schema set under ``openapi/``) it reads."""

FIELD_SINCE: dict[tuple[str, str], int] = {
    ("ResourceSliceSpec", "perDeviceNodeSelection"): 33,
    ("ResourceSliceSpec", "sharedCounters"): 33,
    **{(s, f): 33 for s in ("BasicDevice", "Device")
       for f in ("allNodes", "nodeName", "nodeSelector", "consumesCounters", "taints")},
    **{(s, f): 34 for s in ("BasicDevice", "Device")
       for f in ("allowMultipleAllocations", "bindingConditions", "bindingFailureConditions",
                 "bindsToNode")},
    ("BasicDevice", "nodeAllocatableResourceMappings"): 36,
    ("Device", "nodeAllocatableResourceMappings"): 36,
    ("DeviceCapacity", "requestPolicy"): 34,
    **{("DeviceAttribute", f): 36 for f in ("bools", "ints", "strings", "versions")},
    ("DeviceRequest", "firstAvailable"): 33,
    ("DeviceRequest", "tolerations"): 33,
    ("DeviceRequest", "capacity"): 34,
    ("DeviceSubRequest", "capacity"): 34,
    ("ExactDeviceRequest", "capacity"): 34,
    ("DeviceConstraint", "distinctAttribute"): 34,
    ("AllocationResult", "allocationTimestamp"): 34,
    ("DeviceRequestAllocationResult", "tolerations"): 33,
    **{("DeviceRequestAllocationResult", f): 34
       for f in ("bindingConditions", "bindingFailureConditions", "consumedCapacity", "shareID")},
    ("DeviceClassSpec", "extendedResourceName"): 34,
    ("AllocatedDeviceStatus", "shareID"): 34,
}
"""Fields of the 1.36 schemas that a release before the given minor does not have."""

_TAINT_EFFECT_NONE_SINCE = 36


def parse_bool_map(text: str, what: str) -> dict[str, bool]:
    """``"a=true,b=false"`` as a dict; ValueError naming ``what`` on anything else."""
    result: dict[str, bool] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or value.lower() not in ("true", "false"):
            raise ValueError(f"invalid {what} entry {item!r}: expected key=true|false")
        result[key.strip()] = value.lower() == "true"
    return result


@dataclass(frozen=True)
class ServerModel:
    """One kube-apiserver release with its runtime config and feature gates applied."""

    name: str
    minor: int
    compiled: tuple[str, ...]
    served: tuple[str, ...]
    gates: Mapping[str, bool] = field(default_factory=dict)

    @property
    def git_version(self) -> str:
        return f"v1.{self.minor}.0"

    @property
    def schema_release(self) -> str:
        """The OpenAPI set under ``openapi/`` this release decodes against."""
        return [release for since, release in SCHEMA_RELEASE_SINCE if self.minor >= since][-1]

    @property
    def preferred_version(self) -> str | None:
        return next((v for v in _PRIORITY if v in self.served), None)

    def serves(self, version: str) -> bool:
        return version in self.served

    def enabled(self, gate: str) -> bool:
        return self.gates.get(gate, False)

    def absent_fields(self) -> frozenset[tuple[str, str]]:
        """(struct, json field) pairs of the 1.36 schemas this release does not know."""
        return frozenset(key for key, since in FIELD_SINCE.items() if self.minor < since)

    @property
    def taint_effects(self) -> tuple[str, ...]:
        """Accepted device taint effects, sorted as the server lists them in errors."""
        effects = {"NoExecute", "NoSchedule"}
        if self.minor >= _TAINT_EFFECT_NONE_SINCE:
            effects.add("None")
        return tuple(sorted(effects))


MODELS: tuple[str, ...] = tuple(f"1.{m}" for m in range(FIRST_MINOR, LAST_MINOR + 1))


def gate_default(gate: str, minor: int) -> bool:
    default = False
    for since, value in GATES[gate]:
        if minor >= since:
            default = value
    return default


def load_model(
    name: str,
    runtime_config: str | Mapping[str, bool] | None = None,
    feature_gates: str | Mapping[str, bool] | None = None,
) -> ServerModel:
    """Release ``name`` ("1.36") with ``--runtime-config`` and ``--feature-gates`` applied.

    ``runtime_config`` takes the server's spelling: ``resource.k8s.io/v1beta1=true`` (comma
    separated), ``resource.k8s.io=false`` for the whole group, or ``api/all=true``. Raises
    ValueError for an unknown model, gate or version, as the real server refuses to start.
    """
    if name not in MODELS:
        raise ValueError(f"unknown API server model {name!r}; known: {', '.join(MODELS)}")
    minor = int(name.split(".")[1])
    compiled = _compiled(minor)
    served = set(_served_by_default(minor))
    config = parse_bool_map(runtime_config, "--runtime-config") if isinstance(
        runtime_config, str) else dict(runtime_config or {})
    for key, on in config.items():
        if key in ("api/all", GROUP):
            served = set(compiled) if on else set()
            continue
        group, _, version = key.partition("/")
        if group != GROUP or version not in compiled:
            raise ValueError(f"--runtime-config: unknown api group version {key!r} in {name}")
        served = served | {version} if on else served - {version}
    for version in served & set(UNMODELLED_VERSIONS):
        raise ValueError(f"{GROUP}/{version} is compiled into {name} but not emulated "
                         "(no OpenAPI schema of it ships with the emulator)")
    known = [gate for gate in GATES if minor < REMOVED_SINCE.get(gate, minor + 1)]
    gates = {gate: gate_default(gate, minor) for gate in known}
    overrides = parse_bool_map(feature_gates, "--feature-gates") if isinstance(
        feature_gates, str) else dict(feature_gates or {})
    for gate, on in overrides.items():
        if gate not in known:
            raise ValueError(f"unrecognized feature gate: {gate}")
        if minor >= LOCKED_SINCE.get(gate, minor + 1) and on != gates[gate]:
            raise ValueError(f"cannot set feature gate {gate} to {str(on).lower()}, feature is "
                             f"locked to {str(gates[gate]).lower()}")
        gates[gate] = on
    return ServerModel(
        name=name, minor=minor, compiled=compiled,
        served=tuple(v for v in _PRIORITY if v in served), gates=gates,
    )
