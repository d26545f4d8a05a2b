"""Reading an image's header exactly, for both formats the readers parse.

A header field that claims more bytes than the file holds, or a read that comes back short
(a file truncated while being read), is the image's error, worded the same for GBS and
xclbin, never a short buffer handed on to ``struct`` or the JSON parser.
"""

from __future__ import annotations

from typing import BinaryIO


def read_exact(stream: BinaryIO, count: int, available: int, what: str, image: str) -> bytes:
    """``count`` bytes of ``what`` from ``stream``, which has ``available`` left; a
    ValueError naming the ``image`` format when they are not all there."""
    if count > available:
        raise ValueError(f"{image} truncated: {what} needs {count} bytes, the file has "
                         f"{max(available, 0)}")
    data = stream.read(count)
    if len(data) != count:
        raise ValueError(f"{image} truncated: {what} needs {count} bytes, read {len(data)}")
    return data
