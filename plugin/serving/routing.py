"""Small pieces of serving one socket: telling files apart, and routing calls by generation."""

from __future__ import annotations

from pathlib import Path

import grpc

FileIdentity = tuple[int, int, int]
"""What tells one file from its replacement at the same path (inodes get reused)."""


def identity(path: Path) -> FileIdentity | None:
    """What tells one file from its replacement at the same path (inodes get reused)."""
    try:
        st = path.lstat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


class GenerationRouter(grpc.GenericRpcHandler):
    """Routes calls to the generation on offer; other generations' paths are UNIMPLEMENTED.

    One socket serves whichever generation is being negotiated: v1alpha1 and v1alpha2 share
    method paths with different response shapes, so only one can be live at a time.
    """

    def __init__(self) -> None:
        self._table: dict[str, grpc.RpcMethodHandler] = {}

    def activate(self, table: dict[str, grpc.RpcMethodHandler]) -> None:
        self._table = table

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        return self._table.get(handler_call_details.method)  # type: ignore[attr-defined]
