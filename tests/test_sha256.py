"""The interpreter's own SHA-256 gives the digests sha256sum and OpenSSL give."""

from __future__ import annotations

import hashlib
import os

import pytest

from plugin.model import sha256


@pytest.mark.parametrize("data", [b"", b"abc", os.urandom(3 * 1024 * 1024 + 7)])
def test_digests_match_hashlib(data: bytes) -> None:
    assert sha256.sha256_hex(data) == hashlib.sha256(data).hexdigest()
    streamed = sha256.new_sha256()
    for start in range(0, len(data), 65536):
        streamed.update(memoryview(data)[start:start + 65536])
    assert streamed.hexdigest() == hashlib.sha256(data).hexdigest()


def test_the_known_answer_of_abc() -> None:
    """FIPS 180-2's first example, independent of any implementation here."""
    assert sha256.sha256_hex(b"abc") == (
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")


def test_it_is_not_openssl() -> None:
    """The point of the module: the privileged loader maps no libcrypto to hash."""
    assert sha256.new_sha256.__module__ in {"_sha2", "_sha256"}
