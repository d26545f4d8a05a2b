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
request the last one that applies wins, so a claim can name a function other than its class's.
Configurations of this driver of another ``kind`` or ``apiVersion`` are refused: there is no
other kind, and silently ignoring a typo'd one would prepare a device with the wrong function.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import PurePosixPath

from plugin.programming.ids import dashed, sysfs_id

KIND = "FpgaFunction"
API_GROUP_VERSION = "v1alpha1"
FUNCTION_FIELDS = {"afuID": "intel", "xclbinUUID": "alveo", "agfiID": "aws"}
"""Function ID field -> the device family (backend) it names a function of."""
CLEAR_FIELD = "clearOnUnprepare"
_TOP_FIELDS = ("apiVersion", "kind", *FUNCTION_FIELDS, "image", CLEAR_FIELD)
_CLEAR_FIELDS = (*FUNCTION_FIELDS, "image")
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

    def describe(self) -> str:
        image = f" from image {self.image}" if self.image else ""
        return f"{self.field} {self.function_id}{image}"

    def shown(self) -> str:
        """``afuID d8424dc4-...`` as users and vendor tools print it."""
        shown = self.function_id if self.family == "aws" else dashed(self.function_id)
        return f"{self.field} {shown}"


def config_api_version(driver: str) -> str:
    return f"{driver}/{API_GROUP_VERSION}"


def parse_function(driver: str, parameters: object, where: str,
                   from_class: bool) -> FunctionSpec:
    """The function of one configuration's ``parameters``; ValueError naming ``where`` and
    the field when they are not a well-formed ``FpgaFunction`` of ``driver``."""
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
    clear = None
    if CLEAR_FIELD in parameters:
        if not from_class:
            raise ValueError(f"{where}: {CLEAR_FIELD} may only be set in a DeviceClass (what "
                             "a card is left holding is the admin's choice)")
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
    return FunctionSpec(spec.family, spec.field, spec.function_id, spec.image, where, clear)


def _function(fields: Mapping[str, object], what: str, where: str) -> FunctionSpec:
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
        if "image" in fields:
            raise ValueError(f"{what}: image is not used with agfiID: an AWS slot is loaded "
                             "by its AGFI ID")
        return FunctionSpec(family, name, function_id, None, where)
    normalised = sysfs_id(value)
    if normalised is None:
        raise ValueError(f"{what}: {name} {value[:60]!r} is not a 128-bit ID (32 hex digits "
                         "or a dashed UUID)")
    if "image" not in fields:
        raise ValueError(f"{what}: image is required with {name}: the file of the node's "
                         "image library that holds the function")
    return FunctionSpec(family, name, normalised, _image_name(fields["image"], what), where)


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


@dataclass(frozen=True)
class ClaimFunctions:
    """The functions one claim's configurations name: (requests it applies to, empty for
    every request; whether a DeviceClass gave it; the function), in the server's order."""

    specs: tuple[tuple[tuple[str, ...], bool, FunctionSpec], ...]

    def function_for(self, request: str) -> FunctionSpec | None:
        """The last configuration that applies to result ``request`` (``<r>`` or
        ``<r>/<s>``); what it clears to on unprepare is always the last DeviceClass's that
        applies: a claim naming its own function does not drop the admin's clear."""
        found = clear = None
        for requests, from_class, spec in self.specs:
            if requests and request not in requests and \
                    request.split("/", 1)[0] not in requests:
                continue
            found = spec
            if from_class:
                clear = spec.clear
        if found is None:
            return None
        if clear is not None and clear.family == found.family and found.clear != clear:
            found = replace(found, clear=clear)
        return found


NO_FUNCTIONS = ClaimFunctions(())


def functions_of(driver: str, configs: Sequence[tuple[str, tuple[str, ...], object]]
                 ) -> ClaimFunctions:
    """Every configuration of ``driver`` as (source, requests, parameters), in the server's
    order, parsed; ValueError for the first that is not well-formed (a claim is refused
    whole: preparing some of its devices with a function and others without would be
    worse than an error the user can read)."""
    specs = []
    counts: dict[str, int] = {}
    for source, requests, parameters in configs:
        index = counts.get(source, 0)
        counts[source] = index + 1
        owner = "DeviceClass" if source == "FromClass" else "claim"
        where = f"{owner} configuration {index} for {_requests(requests)}"
        from_class = source == "FromClass"
        specs.append((requests, from_class, parse_function(driver, parameters, where,
                                                           from_class=from_class)))
    return ClaimFunctions(tuple(specs)) if specs else NO_FUNCTIONS


def _requests(requests: tuple[str, ...]) -> str:
    if not requests:
        return "every request"
    return f"request{'s' if len(requests) > 1 else ''} {', '.join(requests)}"
