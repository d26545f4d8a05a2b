"""After a move back to the device plugin, a recorded claim's devices are released only when
the API server says the claim itself is gone; any other answer keeps them held."""

from __future__ import annotations

from typing import Any

import pytest

from plugin.serving.dra.apiserver import (
    ApiRefused,
    ApiUnavailable,
    NoResourceApi,
    NotFound,
)
from plugin.serving.dra.claims_held import claim_in_use as _claim_in_use
from value_types.claims import ClaimRef

REF = ClaimRef(namespace="default", name="pod-accelerators", uid="uid-1")


class Api:
    def __init__(self, answer: Any) -> None:
        self.answer = answer

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


@pytest.mark.parametrize("failure", [
    NotFound("the server could not find the requested resource", unserved=True),
    NoResourceApi("no resource.k8s.io version served", 404),
    ApiUnavailable("connection refused"),
    ApiRefused("forbidden", 403),
    ValueError("an answer that cannot be read"),
])
async def test_an_answer_that_is_not_the_claim_being_gone_keeps_it_held(failure) -> None:
    assert await _claim_in_use(Api(failure), REF) is True  # type: ignore[arg-type]


async def test_a_claim_that_is_gone_releases_its_devices() -> None:
    assert await _claim_in_use(Api(NotFound("not found")), REF) is False  # type: ignore[arg-type]


async def test_a_claim_made_anew_under_the_name_or_no_longer_reserved_releases_them() -> None:
    allocated = {"status": {"allocation": {"devices": {}}, "reservedFor": [{"name": "p"}]}}
    assert await _claim_in_use(Api({"metadata": {"uid": "uid-1"}, **allocated}), REF) is True
    assert await _claim_in_use(Api({"metadata": {"uid": "uid-2"}, **allocated}), REF) is False
    unreserved = {"metadata": {"uid": "uid-1"}, "status": {"allocation": {"devices": {}}}}
    assert await _claim_in_use(Api(unreserved), REF) is False
