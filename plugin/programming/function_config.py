"""The function a claim needs, as the driver's own opaque configuration says it.

An admin's DeviceClass (one class per function: its CEL selects devices with a compatible
interface, optionally under an ``extendedResourceName`` such as ``b-com.com/nlb0``) or a
claim carries, for this driver::

    opaque:
      driver: accelerator.b-com.com
      parameters:
        apiVersion: accelerator.b-com.com/v1alpha1     # <driver name>/v1alpha1
        kind: FpgaFunction
        afuID: d8424dc4-a4a3-c413-f89e-433683f9040b    # or xclbinUUID, or agfiID
        image: nlb0/nlb0.gbs                           # a file of the node's image library
        clearOnUnprepare:                              # DeviceClass only, optional
          afuID: ...
          image: ...

Exactly one function ID, spelt per family: ``afuID`` (Intel: the AFU ID a port reports),
``xclbinUUID`` (Alveo: the xclbin's UUID) or ``agfiID`` (AWS: the global image ID
``agfi-`` + 17 hex digits, loaded by ID, so no ``image``). Checked strictly, as the Go
example driver decodes its configuration (``k8s.io/dynamic-resource-allocation`` users use a
strict decoder): an unknown field, a wrong type, a second function ID, an image with an AGFI,
a path that is absolute or has ``..``: each is that claim's error, naming the configuration
(its source and index) and the field. The API server stores the parameters as given; nothing
before the driver checks them.

Configurations come in the server's order (classes first, then the claim's own), and for one
request the last one that applies wins. A configuration naming no request applies to every
request, except one copied from a DeviceClass: that one applies to the requests allocated from
that class only. Schedulers before kubernetes#134793 copied each request's class
configuration with no request names, so read literally, a claim with two requests of two
classes would have each class's function applied to both (and the last one loaded for both).
The allocation does not say which class such a configuration came from: when the claim's
requests are of more than one class, the caller looks the classes up (``class_configs``) and
the configuration applies to the requests of the classes that hold it.

Configurations of this driver of another ``kind`` or ``apiVersion`` are refused: there is no
other kind, and silently ignoring a typo'd one would prepare a device with the wrong function.

The admin's catalogue is enforced: anyone who may create a ResourceClaim writes the claim's
own configuration, so a claim may name a function of its own only where its request's
DeviceClass lets it, in ``allowedClaimFunctions``::

        allowedClaimFunctions:                 # DeviceClass only
          - afuID: 9e1f4ab2-...                # a function claims of this class may choose
            image: nlb3/nlb3.gbs               # optional: pins the file (else the claim's)
            sha256: 3f1c...                    # optional: pins the bytes (else the claim's)

A claim restating its class's own function (same ID, same image) is allowed too; any other
is refused, naming the class, the function and the field, before anything is loaded. A
class may carry only ``allowedClaimFunctions`` (no function of its own): its claims must
then pick one. ``sha256`` (64 hex digits) pins an image's content (:mod:`.digest`).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import PurePosixPath

from plugin.programming.digest import normalise_sha256
from plugin.programming.ids import dashed, sysfs_id

KIND = "FpgaFunction"
API_GROUP_VERSION = "v1alpha1"
FUNCTION_FIELDS = {"afuID": "intel", "xclbinUUID": "alveo", "agfiID": "aws"}
"""Function ID field -> the device family (backend) it names a function of."""
CLEAR_FIELD = "clearOnUnprepare"
ALLOWED_FIELD = "allowedClaimFunctions"
DIGEST_FIELD = "sha256"
_TOP_FIELDS = ("apiVersion", "kind", *FUNCTION_FIELDS, "image", DIGEST_FIELD, CLEAR_FIELD,
               ALLOWED_FIELD)
_CLEAR_FIELDS = (*FUNCTION_FIELDS, "image", DIGEST_FIELD)
MAX_ALLOWED = 64
"""Entries of ``allowedClaimFunctions``: a catalogue, not a library listing."""
_AGFI = re.compile(r"^agfi-[0-9a-f]{17}$")
MAX_IMAGE_NAME = 1024


@dataclass(frozen=True)
class FunctionSpec:
    """One function a device must hold: ``function_id`` normalised (32 lower-case hex digits
    for AFU IDs and xclbin UUIDs, ``agfi-...`` for AWS), ``image`` the library file that
    holds it (None for AWS)."""

    family: str
    field: str
    function_id: str
    image: str | None
    where: str
    """Which configuration said so, for messages: ``DeviceClass configuration 0``."""
    clear: FunctionSpec | None = None
    sha256: str | None = None
    """The digest ``image``'s bytes must have, when the configuration pins one."""

    def describe(self) -> str:
        image = f" from image {self.image}" if self.image else ""
        return f"{self.field} {self.function_id}{image}"

    def same_function(self, other: FunctionSpec) -> bool:
        return (self.family, self.function_id) == (other.family, other.function_id)

    def shown(self) -> str:
        """``afuID d8424dc4-...`` as users and vendor tools print it."""
        return function_shown(self.family, self.function_id)


def function_shown(family: str, function_id: str | None, absent: str = "nothing") -> str:
    """A function of a device of ``family`` as users and vendor tools print it: the
    configuration's field and the ID (AFU IDs and xclbin UUIDs dashed); ``absent`` for no
    function (or none the driver can read)."""
    if not function_id:
        return absent
    field = next((name for name, named in FUNCTION_FIELDS.items() if named == family),
                 "function")
    return f"{field} {function_id if family == 'aws' else dashed(function_id)}"


def config_api_version(driver: str) -> str:
    return f"{driver}/{API_GROUP_VERSION}"


def parse_function(driver: str, parameters: object, where: str,
                   from_class: bool) -> FunctionSpec:
    """The function of one configuration's ``parameters``; ValueError naming ``where`` and
    the field when they are not a well-formed ``FpgaFunction`` of ``driver`` naming one."""
    parsed = parse_config(driver, parameters, where, from_class)
    if parsed.spec is None:
        raise ValueError(f"{where}: exactly one of {' or '.join(FUNCTION_FIELDS)} names the "
                         "function; none is given")
    return parsed.spec


@dataclass(frozen=True)
class ParsedConfig:
    """One configuration: its own function (None for a class that only lists what its
    claims may choose) and, for a DeviceClass, the functions its claims may choose."""

    spec: FunctionSpec | None
    allowed: tuple[FunctionSpec, ...] = ()


def parse_config(driver: str, parameters: object, where: str,
                 from_class: bool) -> ParsedConfig:
    """One configuration's ``parameters`` checked strictly (see the module docstring)."""
    if not isinstance(parameters, Mapping):
        raise ValueError(f"{where}: parameters must be an object with apiVersion "
                         f"{config_api_version(driver)} and kind {KIND}")
    version, kind = parameters.get("apiVersion"), parameters.get("kind")
    if version != config_api_version(driver):
        raise ValueError(f"{where}: apiVersion {version!r} is not "
                         f"{config_api_version(driver)!r}")
    if kind != KIND:
        raise ValueError(f"{where}: kind {kind!r} is not {KIND!r}")
    _no_unknown(parameters, _TOP_FIELDS, where)
    for admin_only, why in ((CLEAR_FIELD, "what a card is left holding"),
                            (ALLOWED_FIELD, "which functions a class's claims may load")):
        if admin_only in parameters and not from_class:
            raise ValueError(f"{where}: {admin_only} may only be set in a DeviceClass ({why} "
                             "is the admin's choice)")
    allowed = _allowed(parameters.get(ALLOWED_FIELD), where) \
        if ALLOWED_FIELD in parameters else ()
    named = any(name in parameters for name in FUNCTION_FIELDS)
    if not named and ALLOWED_FIELD in parameters:
        for extra in ("image", DIGEST_FIELD, CLEAR_FIELD):
            if extra in parameters:
                raise ValueError(f"{where}: {extra} is given but no function "
                                 f"({' or '.join(FUNCTION_FIELDS)}) for it to apply to")
        return ParsedConfig(None, allowed)
    clear = None
    if CLEAR_FIELD in parameters:
        value = parameters[CLEAR_FIELD]
        if not isinstance(value, Mapping):
            raise ValueError(f"{where}: {CLEAR_FIELD} must be an object")
        _no_unknown(value, _CLEAR_FIELDS, f"{where}: {CLEAR_FIELD}")
        clear = _function(value, f"{where}: {CLEAR_FIELD}", where)
    spec = _function(parameters, where, where)
    if clear is not None and clear.family != spec.family:
        raise ValueError(f"{where}: {CLEAR_FIELD} names a function of the {clear.family} "
                         f"family ({clear.field}), the function one of the {spec.family} "
                         f"family ({spec.field})")
    return ParsedConfig(replace(spec, clear=clear), allowed)


def _allowed(value: object, where: str) -> tuple[FunctionSpec, ...]:
    what = f"{where}: {ALLOWED_FIELD}"
    if not isinstance(value, list):
        raise ValueError(f"{what} must be a list of functions")
    if len(value) > MAX_ALLOWED:
        raise ValueError(f"{what} has {len(value)} entries, more than {MAX_ALLOWED}")
    entries = []
    for index, entry in enumerate(value):
        at = f"{what}[{index}]"
        if not isinstance(entry, Mapping):
            raise ValueError(f"{at} must be an object naming a function")
        _no_unknown(entry, _CLEAR_FIELDS, at)
        entries.append(_function(entry, at, where, image_optional=True))
    return tuple(entries)


def _function(fields: Mapping[str, object], what: str, where: str, *,
              image_optional: bool = False) -> FunctionSpec:
    given = [name for name in FUNCTION_FIELDS if name in fields]
    if len(given) != 1:
        names = " or ".join(FUNCTION_FIELDS)
        problem = "none is given" if not given else f"{' and '.join(given)} are both given"
        raise ValueError(f"{what}: exactly one of {names} names the function; {problem}")
    name = given[0]
    family = FUNCTION_FIELDS[name]
    value = fields[name]
    if not isinstance(value, str):
        raise ValueError(f"{what}: {name} must be a string, not {type(value).__name__}")
    if family == "aws":
        function_id = value.strip().lower()
        if not _AGFI.match(function_id):
            raise ValueError(f"{what}: agfiID {value[:60]!r} is not an AGFI ID "
                             "(agfi- and 17 hex digits)")
        for unused in ("image", DIGEST_FIELD):
            if unused in fields:
                raise ValueError(f"{what}: {unused} is not used with agfiID: an AWS slot is "
                                 "loaded by its AGFI ID")
        return FunctionSpec(family, name, function_id, None, where)
    normalised = sysfs_id(value)
    if normalised is None:
        raise ValueError(f"{what}: {name} {value[:60]!r} is not a 128-bit ID (32 hex digits "
                         "or a dashed UUID)")
    digest = None
    if DIGEST_FIELD in fields:
        try:
            digest = normalise_sha256(fields[DIGEST_FIELD])
        except ValueError as exc:
            raise ValueError(f"{what}: {exc}") from None
    if "image" not in fields:
        if image_optional:
            return FunctionSpec(family, name, normalised, None, where, sha256=digest)
        raise ValueError(f"{what}: image is required with {name}: the file of the node's "
                         "image library that holds the function")
    return FunctionSpec(family, name, normalised, _image_name(fields["image"], what), where,
                        sha256=digest)


def _image_name(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what}: image must be a non-empty string")
    if len(value) > MAX_IMAGE_NAME or "\0" in value:
        raise ValueError(f"{what}: image {value[:60]!r}... is not a file name")
    path = PurePosixPath(value)
    if path.is_absolute() or ".." in path.parts:
        raise ValueError(f"{what}: image {value!r} must be a path inside the image library "
                         "(relative, without '..')")
    return value


def _no_unknown(fields: Mapping[object, object], known: Sequence[str], what: str) -> None:
    unknown = sorted(str(name) for name in fields if name not in known)
    if not unknown:
        return
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=1)
        hints.append(f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name))
    raise ValueError(f"{what}: unknown field{'s' if len(unknown) > 1 else ''} "
                     f"{', '.join(hints)}; known: {', '.join(known)}")


class FunctionRefused(ValueError):
    """A claim names a function of its own that its request's DeviceClass does not let it
    choose: the admin's catalogue says no. Carries what the audit records."""

    def __init__(self, message: str, request: str, device_class: str,
                 spec: FunctionSpec) -> None:
        super().__init__(message)
        self.request = request
        self.device_class = device_class
        self.spec = spec


@dataclass(frozen=True)
class _Entry:
    requests: tuple[str, ...]
    from_class: bool
    parsed: ParsedConfig
    classes: frozenset[str] | None = None
    """For a class configuration naming no request: the classes it came from (None: every
    request, as when all of the claim's requests are of one class)."""

    def applies_to(self, request: str, device_class: str) -> bool:
        if self.requests:
            return request in self.requests or request.split("/", 1)[0] in self.requests
        return self.classes is None or device_class in self.classes


@dataclass(frozen=True)
class ClaimFunctions:
    """The functions one claim's configurations name, in the server's order, and the
    DeviceClass of each request (``<r>`` or ``<r>/<s>`` -> class name), to name it."""

    entries: tuple[_Entry, ...]
    classes: tuple[tuple[str, str], ...] = ()

    def function_for(self, request: str) -> FunctionSpec | None:
        """The last configuration that applies to result ``request`` (``<r>`` or
        ``<r>/<s>``); what it clears to on unprepare is always the last DeviceClass's that
        applies: a claim naming its own function does not drop the admin's clear. A claim's
        own function must be one its class allows (:class:`FunctionRefused`)."""
        found: _Entry | None = None
        clear = None
        device_class = self.class_of(request)
        for entry in self.entries:
            if not entry.applies_to(request, device_class) or entry.parsed.spec is None:
                continue
            found = entry
            if entry.from_class:
                clear = entry.parsed.spec.clear
        if found is None:
            return None
        spec = found.parsed.spec
        assert spec is not None
        if not found.from_class:
            spec = self._allowed(request, spec)
        if clear is not None and clear.family == spec.family and spec.clear != clear:
            spec = replace(spec, clear=clear)
        return spec

    def _allowed(self, request: str, spec: FunctionSpec) -> FunctionSpec:
        """``spec`` (a claim's own) as its class pins it, or FunctionRefused."""
        offered: list[FunctionSpec] = []
        device_class = self.class_of(request)
        for entry in self.entries:
            if entry.from_class and entry.applies_to(request, device_class):
                if entry.parsed.spec is not None:
                    offered.append(entry.parsed.spec)
                offered.extend(entry.parsed.allowed)
        for choice in offered:
            if not choice.same_function(spec):
                continue
            if choice.image is not None and choice.image != spec.image:
                continue
            if choice.sha256 is not None and spec.sha256 not in (None, choice.sha256):
                continue
            return replace(spec, sha256=spec.sha256 or choice.sha256)
        choices = ", ".join(_choice(c) for c in offered[:8]) or "none"
        raise FunctionRefused(
            f"{spec.where}: DeviceClass {device_class!r} does not let claims choose "
            f"{spec.shown()}{f' from image {spec.image}' if spec.image else ''} (field "
            f"{spec.field}); the class allows: {choices}. An admin lists what its claims may "
            f"choose in its FpgaFunction's {ALLOWED_FIELD}", request, device_class, spec)

    def class_of(self, request: str) -> str:
        """The DeviceClass of result ``request``, as the claim's spec names it."""
        classes = dict(self.classes)
        return classes.get(request) or classes.get(request.split("/", 1)[0]) or "(unknown)"


def _choice(spec: FunctionSpec) -> str:
    pinned = [f"image {spec.image}"] if spec.image else []
    pinned += [f"sha256 {spec.sha256[:12]}..."] if spec.sha256 else []
    return spec.shown() + (f" ({', '.join(pinned)})" if pinned else "")


NO_FUNCTIONS = ClaimFunctions(())


Configs = Sequence[tuple[str, tuple[str, ...], object]]
"""A claim's configurations of one driver: (source, request names, parameters)."""


def needs_class_configs(configs: Configs, classes: Mapping[str, str] | None) -> bool:
    """Whether :func:`functions_of` must be told what each DeviceClass holds: a class
    configuration names no request and the claim's requests are of several classes."""
    return len(set((classes or {}).values())) > 1 and any(
        source == "FromClass" and not requests for source, requests, _ in configs)


def functions_of(driver: str, configs: Configs, classes: Mapping[str, str] | None = None,
                 class_configs: Mapping[str, Sequence[object]] | None = None
                 ) -> ClaimFunctions:
    """Every configuration of ``driver`` as (source, requests, parameters), in the server's
    order, parsed; ValueError for the first that is not well-formed (a claim is refused
    whole: preparing some of its devices with a function and others without would be
    worse than an error the user can read). ``classes``: request -> its DeviceClass.
    ``class_configs``: DeviceClass -> the parameters of its configurations of ``driver``,
    needed where :func:`needs_class_configs` says so (ValueError without it)."""
    entries = []
    counts: dict[str, int] = {}
    for source, requests, parameters in configs:
        index = counts.get(source, 0)
        counts[source] = index + 1
        owner = "DeviceClass" if source == "FromClass" else "claim"
        where = f"{owner} configuration {index} for {_requests(requests)}"
        from_class = source == "FromClass"
        owners = _owners(parameters, where, classes or {}, class_configs) \
            if from_class and not requests else None
        entries.append(_Entry(requests, from_class,
                              parse_config(driver, parameters, where, from_class), owners))
    if not entries:
        return NO_FUNCTIONS
    return ClaimFunctions(tuple(entries), tuple(sorted((classes or {}).items())))


def _owners(parameters: object, where: str, classes: Mapping[str, str],
            class_configs: Mapping[str, Sequence[object]] | None) -> frozenset[str] | None:
    """The DeviceClasses of the claim's requests that hold ``parameters`` (a class
    configuration naming no request); None when the requests are all of one class."""
    named = sorted(set(classes.values()))
    if len(named) <= 1:
        return None
    if class_configs is None:
        raise ValueError(f"{where}: names no request and the claim's requests are of "
                         f"DeviceClasses {', '.join(named)}; which of them it came from "
                         "cannot be told")
    owners = frozenset(c for c in named if parameters in class_configs.get(c, ()))
    if not owners:
        raise ValueError(f"{where}: names no request, and none of the claim's DeviceClasses "
                         f"({', '.join(named)}) holds it now; which of its requests it was "
                         "copied for cannot be told (was a class changed since the claim "
                         "was allocated?)")
    return owners


def _requests(requests: tuple[str, ...]) -> str:
    if not requests:
        return "every request"
    return f"request{'s' if len(requests) > 1 else ''} {', '.join(requests)}"
