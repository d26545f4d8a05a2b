"""SHA-256 from the interpreter's own implementation, never OpenSSL's.

:mod:`hashlib` binds OpenSSL: importing it maps libcrypto, 3.5 MiB of the privileged
``loader``'s memory and the largest body of native code in it, for a job (names, image
digests) that needs one hash. CPython ships SHA-256 as a small extension of its own
(``_sha2`` from 3.12, HACL*; ``_sha256`` in 3.11), with the same ``update``/``hexdigest``
interface and the same digests. It is slower on long inputs (160 to 270 MB/s against
OpenSSL's 1.5 GB/s on a 2-core CI machine; ``python -m bench loader`` measures both): a
400 MiB bitstream takes 1.3 to 2.3 s more per load, beside a load that takes seconds. The
driver's own hash of a library file, on the prepare path, stays OpenSSL's
(:func:`plugin.programming.digest.sha256_of_fd`). An interpreter built without the
extension falls back to :mod:`hashlib`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class Hasher(Protocol):
    def update(self, data: bytes | bytearray | memoryview, /) -> None: ...

    def hexdigest(self) -> str: ...


def _builtin() -> Callable[..., Hasher]:
    try:
        from _sha2 import sha256  # type: ignore[import-not-found]  # CPython 3.12+
    except ImportError:
        try:
            from _sha256 import sha256  # type: ignore[import-not-found,no-redef]  # 3.11
        except ImportError:  # an interpreter built without it
            from hashlib import sha256  # type: ignore[assignment]
    return sha256  # type: ignore[no-any-return]


new_sha256: Callable[..., Hasher] = _builtin()
"""``new_sha256()`` or ``new_sha256(data)``: a SHA-256 hasher, as ``hashlib.sha256``."""


def sha256_hex(data: bytes | bytearray | memoryview) -> str:
    """The hex digest of ``data``."""
    return new_sha256(data).hexdigest()  # type: ignore[no-any-return]
