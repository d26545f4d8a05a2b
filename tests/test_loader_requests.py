"""The loader's request parser against anything a compromised or broken driver could send.

:func:`~plugin.programming.remote.protocol.parse_request` reads the whole input of the
privileged process, so it has one contract whatever the bytes: a :class:`Request` it
checked, or :class:`BadRequest` saying why not. Any other exception (a RecursionError from
deep nesting, an OverflowError from a huge number) would reach the server as a crash of
the connection instead of a refusal. Hypothesis throws raw bytes, arbitrary JSON and
mutated good requests at it; the cases found by hand stay as examples.
"""

from __future__ import annotations

import json
import string
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugin.programming.digest import normalise_sha256
from plugin.programming.remote import protocol
from plugin.programming.remote.protocol import BadRequest, Request, parse_request

PORT = "0000:5e:00.0"
FUNCTION = "d8424dc4a4a3c413f89e433683f9040b"
DIGEST = "9f2c1d5e7a4b3c6d8e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d"
GOOD: dict[str, Any] = {"v": 1, "op": "load", "device": PORT, "function_id": FUNCTION,
                        "image": "intel/nlb0.gbs", "sha256": DIGEST, "timeout": 30}


def parsed_or_refused(data: bytes) -> Request | None:
    """The contract: a checked Request, or BadRequest (None here); anything else fails."""
    try:
        request = parse_request(data)
    except BadRequest as refusal:
        assert str(refusal)
        return None
    assert isinstance(request, Request)
    assert parse_request(request.encode()) == request  # what was accepted is well-formed
    return request


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=protocol.MAX_REQUEST + 2))
def test_any_bytes_are_a_request_or_a_refusal(data: bytes) -> None:
    parsed_or_refused(data)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_any_json_is_a_request_or_a_refusal(value: object) -> None:
    parsed_or_refused(json.dumps(value).encode())


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(sorted(GOOD)),
       json_values | st.integers(min_value=10**300, max_value=10**4000))
def test_a_good_request_with_any_one_field_changed_is_a_request_or_a_refusal(
        field: str, value: object) -> None:
    parsed_or_refused(json.dumps({**GOOD, field: value}).encode())


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=400), st.sampled_from("[{\"-0123456789eE.,: "))
def test_truncated_and_spliced_requests_are_a_request_or_a_refusal(cut: int,
                                                                   junk: str) -> None:
    data = json.dumps(GOOD).encode()
    parsed_or_refused(data[:cut] + junk.encode() * 3 + data[cut:])


@pytest.mark.parametrize(("data", "words"), [
    (b"[" * 4000, "nested too deeply"),
    (b'{"":' * 1300 + b"1" + b"}" * 1300, "nested too deeply"),
    (json.dumps({**GOOD, "timeout": 10**400}).encode(), "timeout must be between"),
    (json.dumps({**GOOD, "timeout": 0}).encode().replace(b"0}", b"9" * 5000 + b"}"),
     "not a JSON object"),
    (json.dumps({**GOOD, "timeout": 1e400}).encode().replace(b"Infinity", b"1e400"),
     "timeout must be between"),
    (json.dumps({**GOOD, "image": "a\ud800.gbs"}).encode(), "not valid Unicode"),
    (json.dumps({**GOOD, "\udfff": 1}).encode(), "unknown field(s) '\\udfff'"),
    (b'{"v": 1, "v": 1, "op": "inventory"}', "a key appears twice"),
    (json.dumps({"v": True, "op": "inventory"}).encode(), "version True"),
    (json.dumps({"v": 1.0, "op": "inventory"}).encode(), "version 1.0"),
    (json.dumps({"v": 1, "op": ["load"]}).encode(), "op ['load']"),
])
def test_malformed_requests_found_by_hand_are_refusals(data: bytes, words: str) -> None:
    with pytest.raises(BadRequest) as refused:
        parse_request(data)
    assert words in str(refused.value)


@pytest.mark.parametrize(("body", "field"), [
    (GOOD, "device"), (GOOD, "function_id"), (GOOD, "sha256"),
    ({"v": 1, "op": "loaded", "device": PORT}, "device"),
])
def test_an_id_with_a_trailing_newline_is_refused(body: dict[str, Any], field: str) -> None:
    """Matched whole: ``$`` in a pattern accepts ``"0000:5e:00.0\\n"``."""
    with pytest.raises(BadRequest, match=f"{field}"):
        parse_request(json.dumps({**body, field: body[field] + "\n"}).encode())


def test_a_digest_is_matched_whole() -> None:
    """What a digest may look like is a spelling (case, prefix, spaces around it), and
    nothing after its 64 digits."""
    with pytest.raises(ValueError, match="not a SHA-256 digest"):
        normalise_sha256(DIGEST + "\n0")
    assert normalise_sha256(f" sha256:{DIGEST.upper()}\n") == DIGEST  # spelling, not content


def test_the_service_answers_a_malformed_request_with_a_refusal() -> None:
    """What the socket carries back: a refusal, not a dropped connection."""
    from plugin.programming.library import ImageLibrary
    from plugin.programming.remote.server import LoaderService

    service = LoaderService(lambda: [], {}, ImageLibrary(__import__("pathlib").Path("/")))
    answer = json.loads(service.answer(b"[" * 4000))
    assert answer["ok"] is False and answer["step"] == protocol.REQUEST_STEP
    assert "nested too deeply" in answer["detail"]
    assert set(string.printable) >= set(json.dumps(answer))


def test_deep_nesting_is_refused_whatever_stack_the_caller_has() -> None:
    # The parser's own limit follows the interpreter's recursion limit, which a process
    # (a test runner's worker, say) may have raised: the refusal must not depend on it.
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(20000)
    try:
        with pytest.raises(BadRequest, match="nested too deeply"):
            parse_request(b'{"":' * 1300 + b"1" + b"}" * 1300)
        with pytest.raises(BadRequest, match="nested too deeply"):
            parse_request(b'{"v": 1, "op": "inventory", "x": [[[[[[[[[1]]]]]]]]]}')
    finally:
        sys.setrecursionlimit(before)
    # Brackets inside a string are not nesting: refused for what it is, an unknown field.
    with pytest.raises(BadRequest, match="unknown field"):
        parse_request(b'{"v": 1, "op": "inventory", "x": "[[[[[[[[[[[["}')
