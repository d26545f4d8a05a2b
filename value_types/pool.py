"""A driver's pool as the DRA API sees it, checked against the API server's limits.

Values only: :mod:`plugin.serving.dra.inventory` builds a :class:`Pool` from the device model,
and the shapes in ``api_versions`` turn it into ResourceSlices of whichever resource.k8s.io
version the server speaks. Each value checks the server's limits when it is made (names,
attribute kinds and sizes, quantities), so a pool that was built can always be published.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from types import MappingProxyType

MAX_NAME = 63
MAX_STRING_BYTES = 64
"""Longest attribute string (and version) value a server accepts, in bytes."""
MAX_DRIVER_NAME = 63
INT64 = (-(2**63), 2**63 - 1)

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$")
_C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_QUANTITY = re.compile(r"^[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
                       r"(?:[eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE])?$")
MAX_IDENTIFIER = 32
CONTEXTS = "contexts"
"""The capacity a shared device publishes: how many users (contexts) its function serves."""
MAX_ATTRIBUTES = 32
"""Attributes and capacities of one device together, at most
(``ResourceSliceMaxAttributesAndCapacitiesPerDevice``)."""


class AttributeKind(Enum):
    STRING = "string value"
    INT = "int value"
    BOOL = "bool value"
    VERSION = "semantic version"


@dataclass(frozen=True, slots=True)
class AttributeValue:
    """One attribute value of exactly one kind, checked against the server's limits on
    creation, so a pool that was built can always be published."""

    kind: AttributeKind
    value: str | int | bool

    def __post_init__(self) -> None:
        problem = value_problem(self.kind, self.value)
        if problem:
            raise ValueError(f"{self.kind.value} {self.value!r}: {problem}")

    @classmethod
    def string(cls, value: str) -> AttributeValue:
        return cls(AttributeKind.STRING, value)

    @classmethod
    def integer(cls, value: int) -> AttributeValue:
        return cls(AttributeKind.INT, value)

    @classmethod
    def boolean(cls, value: bool) -> AttributeValue:
        return cls(AttributeKind.BOOL, value)

    @classmethod
    def version(cls, value: str) -> AttributeValue:
        return cls(AttributeKind.VERSION, value)


def value_problem(kind: AttributeKind, value: object) -> str:
    """Why the server would refuse ``value`` as an attribute of ``kind``; empty if it would not."""
    if kind is AttributeKind.BOOL:
        return "" if isinstance(value, bool) else "not a bool"
    if kind is AttributeKind.INT:
        if not isinstance(value, int) or isinstance(value, bool):
            return "not an int"
        return "" if INT64[0] <= value <= INT64[1] else "outside int64"
    if not isinstance(value, str):
        return "not a string"
    try:
        size = len(value.encode())
    except UnicodeEncodeError:
        return "not valid UTF-8"
    if size > MAX_STRING_BYTES:
        return f"longer than {MAX_STRING_BYTES} bytes"
    if kind is AttributeKind.VERSION and not _SEMVER.match(value):
        return "not a semantic version (semver.org 2.0.0)"
    return ""


def _frozen(mapping: Mapping[str, object]) -> MappingProxyType:
    return MappingProxyType(dict(sorted(mapping.items())))


@dataclass(frozen=True)
class DraDevice:
    """One device of the pool: its DRA name, the model's device ID, what selectors see."""

    name: str
    device_id: str
    attributes: Mapping[str, AttributeValue] = field(default_factory=dict)
    capacity: Mapping[str, str] = field(default_factory=dict)
    healthy: bool = True
    health_reason: str = ""
    health_code: str = ""
    held_by: str = ""
    """Why the device is offered to no new claim, a label value: the API through which a
    running container still holds it (``device-plugin`` after a move to DRA), or
    ``draining`` (published shared, its shares running, but taking no new one); empty:
    free to allocate."""
    shared_contexts: int = 0
    """At least 2: the device is published for sharing (``allowMultipleAllocations`` and a
    :data:`CONTEXTS` capacity of that many, each share taking 1 unless it asks more);
    0: it is allocated whole."""
    binding_conditions: tuple[str, ...] = ()
    """Condition types the driver must set True in a claim's ``status.devices[]`` entry
    before the scheduler binds the claim's pod (KEP-5007 ``bindingConditions``): a function
    is loaded before the pod binds (:mod:`plugin.serving.dra.binding`); empty: none."""
    binding_failure_conditions: tuple[str, ...] = ()
    """Condition types whose True makes the scheduler give up this allocation and schedule
    the pod again (``bindingFailureConditions``); set together with the above."""

    def __post_init__(self) -> None:
        if not is_dns_label(self.name):
            raise ValueError(f"device {self.device_id!r}: name {self.name!r} is not a DNS label")
        problems = [f"{name!r} is not a qualified name" for name in (*self.attributes,
                                                                       *self.capacity)
                    if not is_qualified_name(name)]
        problems += [f"capacity {name} = {value!r} is not a quantity"
                     for name, value in self.capacity.items() if not _QUANTITY.match(value)]
        if self.shared_contexts == 1 or self.shared_contexts < 0:
            problems.append(f"shared_contexts {self.shared_contexts} is neither 0 nor 2 or more")
        if self.shared_contexts and CONTEXTS in self.capacity:
            problems.append(f"capacity {CONTEXTS!r} is the sharing capacity")
        if len(self.attributes) + len(self.capacity) + bool(self.shared_contexts) > MAX_ATTRIBUTES:
            problems.append(f"more than {MAX_ATTRIBUTES} attributes and capacities")
        if problems:
            raise ValueError(f"device {self.device_id!r}: {'; '.join(problems)}")
        object.__setattr__(self, "attributes", _frozen(self.attributes))
        object.__setattr__(self, "capacity", _frozen(self.capacity))

    def __hash__(self) -> int:
        return hash((self.name, self.device_id, tuple(self.attributes.items()),
                     tuple(self.capacity.items()), self.healthy, self.health_reason,
                     self.health_code, self.held_by, self.shared_contexts,
                     self.binding_conditions, self.binding_failure_conditions))


@dataclass(frozen=True)
class Pool:
    """The devices one driver publishes for one node, in the model's order."""

    driver: str
    node_name: str
    name: str
    devices: tuple[DraDevice, ...] = ()

    @cached_property
    def names(self) -> Mapping[str, str]:
        """Device name -> device ID, for mapping allocation results back to devices."""
        return MappingProxyType({d.name: d.device_id for d in self.devices})

    def device_id(self, name: str) -> str | None:
        """The device ID behind an allocated device name, or None if this pool has none."""
        return self.names.get(name)

    def device(self, name: str) -> DraDevice | None:
        return next((d for d in self.devices if d.name == name), None)


def is_dns_label(name: str) -> bool:
    return len(name) <= MAX_NAME and DNS_LABEL.match(name) is not None


def is_qualified_name(name: str) -> bool:
    """An attribute or capacity name: a C identifier of at most 32, optionally behind a
    ``<domain>/`` that could be a driver name (k/k ``validateQualifiedName``)."""
    domain, _, ident = name.rpartition("/")
    if "/" in domain or (domain and (len(domain) > MAX_DRIVER_NAME
                                     or not DNS_SUBDOMAIN.match(domain))):
        return False
    return len(ident) <= MAX_IDENTIFIER and _C_IDENTIFIER.match(ident) is not None
