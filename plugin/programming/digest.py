"""An image's content digest: what pins a library file to the bytes the admin vetted.

A file of the image library is named by path, and a path says nothing about what the file
holds today: a file replaced or rewritten on one node would load whatever it now holds. A
``sha256`` in the ``FpgaFunction`` pins it: the bytes that are checked and loaded must hash
to it, or nothing reaches the card. Digests are spelt as ``sha256sum`` prints them (64 hex
digits); an ``sha256:`` prefix, as OCI digests are written, is accepted and dropped.

Hashing streams the file in chunks: a 400 MiB bitstream is never held whole in memory to be
hashed.
"""

from __future__ import annotations

import os
import re

DIGEST_STEP = "check image digest"
"""The step a load refused for a digest mismatch names (``LoadFailed.step``)."""
CHUNK = 1024 * 1024
_HEX = re.compile(r"[0-9a-f]{64}")


def normalise_sha256(value: object) -> str:
    """``value`` as 64 lower-case hex digits; ValueError saying what a digest looks like."""
    if not isinstance(value, str):
        raise ValueError(f"sha256 must be a string, not {type(value).__name__}")
    digest = value.strip().lower().removeprefix("sha256:")
    if not _HEX.fullmatch(digest):
        raise ValueError(f"sha256 {value[:80]!r} is not a SHA-256 digest (64 hex digits, as "
                         "sha256sum prints it)")
    return digest


def sha256_of_fd(fd: int) -> str:
    """The digest of the whole file open as ``fd`` (read from offset 0, ``pread``: the
    descriptor's own offset is left alone).

    The driver's hash of a library file (:class:`~plugin.programming.image_checks.ImageChecks`,
    on the first claim pinning each version of it, on the prepare path): OpenSSL's, five times
    as fast on long files as the interpreter's own, which loads use
    (:mod:`plugin.model.sha256`). Imported here, not with the module: the privileged loader
    imports this module, and maps no libcrypto."""
    import hashlib

    hasher = hashlib.sha256()
    offset = 0
    while chunk := os.pread(fd, CHUNK, offset):
        hasher.update(chunk)
        offset += len(chunk)
    return hasher.hexdigest()


def mismatch(image: str, expected: str, actual: str) -> str:
    """The words of a refused load: the file and both digests, as a user compares them."""
    return (f"image {image!r} has sha256 {actual}, not the sha256 {expected} its "
            "configuration pins; nothing was loaded")
