"""DRA device selectors evaluated the way the scheduler does: CEL against one published device.

A DeviceClass's ``spec.selectors[].cel.expression`` and a claim request's ``selectors`` are CEL
programs over one variable, ``device``, which Kubernetes builds from a ResourceSlice device
(k8s.io/dynamic-resource-allocation ``cel/compile.go`` ``DeviceMatches``, kubernetes/kubernetes
commit 00faa5e7ae978d4e75e80649cdb2cc46f98ba152). This module builds the same variable and runs
the expression with cel-python (``celpy``), a real CEL implementation, so a test learns what a
selector selects rather than what a string comparison guesses:

* ``device.driver``: the slice's ``spec.driver``.
* ``device.attributes[<domain>].<id>``: each attribute's qualified name split at its first
  ``/``; a name without a domain belongs to the driver's (``parseQualifiedName``), so a driver
  publishing ``family`` is read as ``device.attributes["<driver>"].family``. Values keep their
  kind: string, int, bool, and version as a semantic version (``semver``, Kubernetes's
  ``library.SemverLib``: ``semver()``, ``isSemver()``, ``compareTo``, ``isGreaterThan``,
  ``isLessThan``, ``major``, ``minor``, ``patch``).
* ``device.capacity[<domain>].<id>``: quantities (``compareTo``, ``isGreaterThan``,
  ``isLessThan``, ``asInteger``, ``asApproximateFloat``, and ``quantity()``/``isQuantity()``).
* ``device.allowMultipleAllocations``: the device's field, false when absent (KEP-5075; the
  allocator passes ``AllowMultipleAllocations`` into ``cel.Device``, dynamic-resource-allocation
  ``structured/internal/incubating/allocator_incubating.go`` ``selectorsMatch``, commit
  03ab440c41a8098613d2149f10b367c7f7ce32c8). It exists only while the DRAConsumableCapacity
  gate is on; with it off, reading it is an evaluation error here (the real server refuses
  such an expression at creation, which is not modelled).
* Indexing an unknown domain gives an empty map (compile.go's ``mapper.Find`` default), so
  ``"x" in device.attributes["other.example.com"]`` is false; reading an attribute the device
  does not have is an evaluation error.

What the scheduler does with an evaluation error: the allocator stops at the first selector
that does not match, and a runtime error is no mismatch but an error for the whole claim
("class %s: selector #%d: CEL runtime error", dynamic-resource-allocation
``structured/internal/stable/allocator.go`` ``selectorsMatch``): the claim is not allocated at
all on that node. :func:`selectors_match` reproduces both, raising :class:`CelRuntimeError`.
The CELDeviceSelector API documentation says the same ("Any other result is an error and
causes allocation of devices to abort").

Not modelled: the cost limit, ``cel.bind``, and type checking at creation (the API server
compiles the expression with the declared types; here type mistakes surface at evaluation).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from fractions import Fraction
from functools import cache, total_ordering
from typing import Any

import celpy
from celpy import celtypes

from compat_tests.apiserver import quantity as quantities


class CelRuntimeError(Exception):
    """An expression that failed on a device, or did not give a bool: the scheduler aborts the
    allocation of the claim that asked."""

    def __init__(self, expression: str, device: str, cause: str) -> None:
        super().__init__(f"device {device!r}: CEL runtime error in {expression!r}: {cause}")
        self.expression = expression
        self.device = device
        self.cause = cause


class CelCompileError(ValueError):
    """An expression that does not parse (the API server refuses the object)."""


_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$")


@total_ordering
class Semver:
    """A semantic version, ordered by semver 2.0.0 precedence (build metadata ignored)."""

    def __init__(self, text: str) -> None:
        found = _SEMVER.match(text)
        if not found:
            raise ValueError(f"{text!r} is not a semantic version")
        self.text = text
        self.core = (int(found[1]), int(found[2]), int(found[3]))
        self.pre = tuple(found[4].split(".")) if found[4] else ()

    def _key(self) -> tuple[Any, ...]:
        # A release sorts after its pre-releases; numeric identifiers before alphanumeric.
        pre = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in self.pre)
        return (self.core, not self.pre, pre)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Semver) and self._key() == other._key()

    def __lt__(self, other: Semver) -> bool:
        return self._key() < other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"Semver({self.text!r})"


@total_ordering
class Quantity:
    """A resource quantity, compared by value (``1Gi == 1024Mi``)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.value: Fraction = quantities.parse(text)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and self.value == other.value

    def __lt__(self, other: Quantity) -> bool:
        return self.value < other.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __repr__(self) -> str:
        return f"Quantity({self.text!r})"


class _DomainMap(celtypes.MapType):
    """``device.attributes`` / ``device.capacity``: an unknown domain is an empty map."""

    def __getitem__(self, key: Any) -> Any:
        try:
            return super().__getitem__(key)
        except KeyError:
            return celtypes.MapType({})


def _ordered(a: Any, b: Any) -> int:
    if type(a) is not type(b) or not isinstance(a, Semver | Quantity):
        raise TypeError(f"cannot compare {type(a).__name__} with {type(b).__name__}")
    return 0 if a == b else (-1 if a < b else 1)


def _semver(text: Any) -> Semver:
    return Semver(str(text))


def _is_semver(text: Any) -> celtypes.BoolType:
    return celtypes.BoolType(_SEMVER.match(str(text)) is not None)


def _is_quantity(text: Any) -> celtypes.BoolType:
    try:
        quantities.parse(str(text))
    except ValueError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def _version_part(index: int) -> Any:
    def part(version: Semver) -> celtypes.IntType:
        return celtypes.IntType(version.core[index])
    return part


def _as_integer(value: Quantity) -> celtypes.IntType:
    if value.value.denominator != 1:
        raise ValueError(f"{value.text} is not an integer")
    return celtypes.IntType(int(value.value))


def _kind(value: Any) -> object:
    if isinstance(value, bool | celtypes.BoolType):
        return bool
    if isinstance(value, int | float):
        return float
    for kind in (str, bytes, list, dict):
        if isinstance(value, kind):
            return kind
    return type(value)


def _equal(a: Any, b: Any) -> Any:
    """CEL ``==`` as cel-go (and so Kubernetes) has it: values of different types are
    unequal, not an error (heterogeneous equality), numbers compare by value across int,
    uint and double. An attribute is ``dyn``, so ``slot == "3"`` compiles on a server and is
    false at run time; celpy alone would find no overload."""
    for value in (a, b):
        if isinstance(value, celpy.CELEvalError):
            return value
    if _kind(a) is not _kind(b):
        return celtypes.BoolType(False)
    if _kind(a) is float:
        return celtypes.BoolType(float(a) == float(b) if isinstance(a, float) or
                                 isinstance(b, float) else int(a) == int(b))
    return celpy.evaluation.bool_eq(a, b)


def _not_equal(a: Any, b: Any) -> Any:
    equal = _equal(a, b)
    return equal if isinstance(equal, celpy.CELEvalError) else celtypes.BoolType(not equal)


FUNCTIONS: dict[str, Any] = {
    "_==_": _equal,
    "_!=_": _not_equal,
    "semver": _semver,
    "isSemver": _is_semver,
    "quantity": lambda text: Quantity(str(text)),
    "isQuantity": _is_quantity,
    "compareTo": lambda a, b: celtypes.IntType(_ordered(a, b)),
    "isGreaterThan": lambda a, b: celtypes.BoolType(_ordered(a, b) > 0),
    "isLessThan": lambda a, b: celtypes.BoolType(_ordered(a, b) < 0),
    "major": _version_part(0),
    "minor": _version_part(1),
    "patch": _version_part(2),
    "asInteger": _as_integer,
    "asApproximateFloat": lambda value: celtypes.DoubleType(float(value.value)),
}
"""The Kubernetes CEL library functions a device selector may call on its values."""


def split_qualified_name(name: str, driver: str) -> tuple[str, str]:
    """``(domain, id)`` of an attribute or capacity name; no domain means the driver's."""
    domain, sep, ident = name.partition("/")
    return (domain, ident) if sep else (driver, name)


def _attribute_value(name: str, value: Mapping[str, Any]) -> Any:
    kinds = [k for k in ("string", "int", "bool", "version") if k in value]
    if len(kinds) != 1:
        raise ValueError(f"attribute {name}: not exactly one value in {dict(value)!r}")
    (kind,) = kinds
    raw = value[kind]
    if kind == "string":
        return celtypes.StringType(raw)
    if kind == "int":
        return celtypes.IntType(raw)
    if kind == "bool":
        return celtypes.BoolType(raw)
    return Semver(raw)


def device_variable(device: Mapping[str, Any], driver: str, *,
                    consumable_capacity: bool = True) -> celtypes.MapType:
    """The ``device`` variable for one v1 ResourceSlice device of ``driver``;
    ``consumable_capacity``: the DRAConsumableCapacity gate, which adds
    ``allowMultipleAllocations``."""
    attributes: dict[str, dict[str, Any]] = {}
    for name, value in (device.get("attributes") or {}).items():
        domain, ident = split_qualified_name(name, driver)
        attributes.setdefault(domain, {})[ident] = _attribute_value(name, value)
    capacity: dict[str, dict[str, Any]] = {}
    for name, value in (device.get("capacity") or {}).items():
        domain, ident = split_qualified_name(name, driver)
        capacity.setdefault(domain, {})[ident] = Quantity(str(value["value"]))

    def domains(grouped: dict[str, dict[str, Any]]) -> _DomainMap:
        return _DomainMap({celtypes.StringType(d): celtypes.MapType(
            {celtypes.StringType(k): v for k, v in values.items()})
            for d, values in grouped.items()})

    variable = {
        celtypes.StringType("driver"): celtypes.StringType(driver),
        celtypes.StringType("attributes"): domains(attributes),
        celtypes.StringType("capacity"): domains(capacity),
    }
    if consumable_capacity:
        variable[celtypes.StringType("allowMultipleAllocations")] = celtypes.BoolType(
            device.get("allowMultipleAllocations") is True)
    return celtypes.MapType(variable)


_ENVIRONMENT = celpy.Environment()


@cache
def _program(expression: str) -> celpy.Runner:
    try:
        ast = _ENVIRONMENT.compile(expression)
    except celpy.CELParseError as exc:
        raise CelCompileError(f"{expression!r} does not compile: {exc}") from exc
    return _ENVIRONMENT.program(ast, functions=FUNCTIONS)


def evaluate(expression: str, device: Mapping[str, Any], driver: str, *,
             consumable_capacity: bool = True) -> bool:
    """Whether ``expression`` is true for ``device``; :class:`CelRuntimeError` when it fails
    or gives anything but a bool (the scheduler's two ways to abort an allocation)."""
    name = str(device.get("name", "?"))
    program = _program(expression)
    try:
        result = program.evaluate({"device": device_variable(
            device, driver, consumable_capacity=consumable_capacity)})
    except (celpy.CELEvalError, TypeError, ValueError) as exc:
        raise CelRuntimeError(expression, name, _cause(exc)) from exc
    if isinstance(result, celpy.CELEvalError):
        raise CelRuntimeError(expression, name, _cause(result))
    if not isinstance(result, celtypes.BoolType):
        raise CelRuntimeError(expression, name,
                              f"gave {type(result).__name__} {result!r}, not a bool")
    return bool(result)


def _cause(exc: BaseException) -> str:
    return str(exc.args[0]) if exc.args else type(exc).__name__


def selectors_match(selectors: Sequence[Mapping[str, Any]], device: Mapping[str, Any],
                    driver: str, *, consumable_capacity: bool = True) -> bool:
    """All of ``selectors`` (``[{"cel": {"expression": ...}}]``) hold for ``device``, tried in
    order and stopping at the first false, as the allocator does; an error raises."""
    for selector in selectors:
        expression = selector.get("cel", {}).get("expression")
        if expression is None:
            raise ValueError(f"selector {dict(selector)!r} has no CEL expression")
        if not evaluate(expression, device, driver, consumable_capacity=consumable_capacity):
            return False
    return True
