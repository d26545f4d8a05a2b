"""What the driver may ask the loader, and what it answers: one JSON object each way.

The request is the whole attack surface of the privileged process, so it is narrow and
read strictly: one object of at most :data:`MAX_REQUEST` bytes ending the connection's
input (or a newline), ``"v": 1``, an ``op`` of :data:`OPS`, exactly that op's fields with
their types and bounds, nothing else. Everything in it is a name or a claim the loader
checks for itself: the device is looked up in the loader's own discovery, the image in its
own library, the digest over the bytes it reads.

* ``load``: ``device`` (a device ID), ``function_id``, ``image`` (a library name, or null
  for AWS), ``sha256`` (64 hex digits, or null), ``timeout`` (seconds);
* ``loaded``: ``device``: which function the device holds when only the loader's tool can
  tell (AWS's describe); read-only;
* ``inventory``: which devices the loader can program here and, for the others, why not,
  so the driver's published ``programmable`` attribute says what the loader can do.

An answer is ``{"ok": true, ...}`` or ``{"ok": false, "step", "detail", "touched"}``, the
fields of :class:`~plugin.programming.loaders.base.LoadFailed`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from plugin.programming.digest import normalise_sha256

VERSION = 1
MAX_REQUEST = 8192
"""Bytes a request may have: a library path of a few KiB and some IDs fit many times."""
MAX_ANSWER = 1 << 20
"""Bytes an answer may have (an inventory of many devices, each with its reason)."""
OPS = ("load", "loaded", "inventory")
REQUEST_STEP = "loader request"
"""The step a refused request names."""
MAX_TIMEOUT = 3600.0
MAX_NESTING = 8
"""Levels of arrays and objects a request may nest (a good one has one: itself)."""
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9:._-]{0,252}")
_FUNCTION = re.compile(r"[A-Za-z0-9-]{1,64}")
"""Both matched whole (``fullmatch``): ``$`` would let a trailing newline through."""
_FIELDS: dict[str, dict[str, tuple[type, ...]]] = {
    "load": {"device": (str,), "function_id": (str,), "image": (str, type(None)),
             "sha256": (str, type(None)), "timeout": (int, float)},
    "loaded": {"device": (str,)},
    "inventory": {},
}


class BadRequest(ValueError):
    """A request the loader will not read; the message says which field and why."""


@dataclass(frozen=True)
class Request:
    op: str
    device: str | None = None
    function_id: str | None = None
    image: str | None = None
    sha256: str | None = None
    timeout: float = 60.0

    def encode(self) -> bytes:
        body: dict[str, Any] = {"v": VERSION, "op": self.op}
        if self.op in ("load", "loaded"):
            body["device"] = self.device
        if self.op == "load":
            body.update(function_id=self.function_id, image=self.image, sha256=self.sha256,
                        timeout=self.timeout)
        return json.dumps(body).encode() + b"\n"


def parse_request(data: bytes) -> Request:
    """The request ``data`` holds; :class:`BadRequest` naming what is wrong, and nothing
    else, whatever the bytes (a malformed request is a refusal, never a crash)."""
    if len(data) > MAX_REQUEST:
        raise BadRequest(f"request is over {MAX_REQUEST} bytes")
    if _nesting(data) > MAX_NESTING:
        raise BadRequest(f"request is not a JSON object: nested too deeply (over "
                         f"{MAX_NESTING} levels)")
    try:
        body = json.loads(data.decode("utf-8"), parse_constant=_no_constant,
                          object_pairs_hook=_no_repeats)
    except RecursionError:
        # Deep nesting (``[`` a few thousand times) exhausts the parser's stack.
        raise BadRequest("request is not a JSON object: nested too deeply") from None
    except (ValueError, OverflowError) as exc:
        # ValueError covers bad UTF-8, bad JSON and over-long integers.
        raise BadRequest(f"request is not a JSON object: {str(exc)[:200]}") from None
    if not isinstance(body, dict):
        raise BadRequest("request is not a JSON object")
    version = body.get("v")
    if type(version) is not int or version != VERSION:  # not true, not 1.0
        raise BadRequest(f"request version {_shown(version)} is not {VERSION}")
    op = body.get("op")
    if not isinstance(op, str) or op not in OPS:
        raise BadRequest(f"op {_shown(op)} is not one of {', '.join(OPS)}")
    fields = _FIELDS[op]
    extra = sorted(set(body) - set(fields) - {"v", "op"})
    if extra:
        raise BadRequest(f"{op}: unknown field(s) {', '.join(map(repr, extra))[:200]}")
    for name, kinds in fields.items():
        if name not in body:
            raise BadRequest(f"{op}: field {name} is missing")
        value = body[name]
        if not isinstance(value, kinds) or isinstance(value, bool):
            raise BadRequest(f"{op}: field {name} has the wrong type "
                             f"({type(value).__name__})")
        if isinstance(value, str) and not _utf8(value):
            raise BadRequest(f"{op}: field {name} is not valid Unicode (a lone surrogate)")
    try:
        timeout = float(body.get("timeout", 60.0))
    except OverflowError:  # an integer too large for a float
        raise BadRequest(f"load: timeout must be between 0 and {MAX_TIMEOUT:g} "
                         "seconds") from None
    request = Request(op=op, device=body.get("device"), function_id=body.get("function_id"),
                      image=body.get("image"), sha256=body.get("sha256"), timeout=timeout)
    return _checked(request)


def _nesting(data: bytes) -> int:
    """How deep ``data``'s arrays and objects nest, strings skipped: found before parsing,
    so how deep the parser may go never depends on the stack the caller has left."""
    deepest = depth = 0
    in_string = escaped = False
    for byte in data:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return deepest


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")


def _no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose keys are all different: with a key twice, which value counts would
    depend on the parser, and the driver never writes one."""
    body = dict(pairs)
    if len(body) != len(pairs):
        raise ValueError("a key appears twice in one object")
    return body


def _shown(value: object) -> str:
    """A value a request sent, short and printable (``repr`` escapes what a log cannot
    carry)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _utf8(text: str) -> bool:
    """False for text JSON allows but no file name or log line can carry (``\\ud800``)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _checked(request: Request) -> Request:
    if request.device is not None and not _ID.fullmatch(request.device):
        raise BadRequest(f"{request.op}: device {request.device[:80]!r} is not a device ID")
    if request.op != "load":
        return request
    assert request.function_id is not None
    if not _FUNCTION.fullmatch(request.function_id):
        raise BadRequest(f"load: function_id {request.function_id[:80]!r} is not a function "
                         "ID (hex digits, or an AGFI)")
    if request.image is not None and not 0 < len(request.image) <= 4096:
        raise BadRequest("load: image must be a library name of 1 to 4096 characters")
    if not math.isfinite(request.timeout) or not 0 < request.timeout <= MAX_TIMEOUT:
        raise BadRequest(f"load: timeout must be between 0 and {MAX_TIMEOUT:g} seconds")
    if request.sha256 is not None:
        try:
            normalise_sha256(request.sha256)
        except ValueError as exc:
            raise BadRequest(f"load: {exc}") from None
        if request.sha256 != normalise_sha256(request.sha256):
            raise BadRequest("load: sha256 must be 64 lower-case hex digits")
    return request


def ok(**fields: Any) -> bytes:
    return json.dumps({"ok": True, **fields}).encode() + b"\n"


def refused(step: str, detail: str, *, touched: bool = False) -> bytes:
    return json.dumps({"ok": False, "step": step, "detail": detail[:4000],
                       "touched": touched}).encode() + b"\n"


def parse_answer(data: bytes) -> dict[str, Any]:
    """The loader's answer; ValueError when it is not one (a loader of another version)."""
    if len(data) > MAX_ANSWER:
        raise ValueError(f"answer is over {MAX_ANSWER} bytes")
    body = json.loads(data.decode("utf-8"))
    if not isinstance(body, dict) or not isinstance(body.get("ok"), bool):
        raise ValueError("answer is not a loader's answer")
    if not body["ok"] and not (isinstance(body.get("step"), str)
                               and isinstance(body.get("detail"), str)
                               and isinstance(body.get("touched"), bool)):
        raise ValueError("refusal lacks step, detail or touched")
    return body
