"""The flags of the loader split: ``serve --loader-socket`` and the ``loader`` command.

Kept apart from :mod:`plugin.cli.config` (which calls in here) so the split reads as one
piece: where the driver finds the loader, and what the loader serves and to whom.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Protocol

LOADER_NETWORK = ("isolate", "keep")
DEFAULT_ALLOWED_UIDS = (0,)


class Adder(Protocol):
    def add(self, *flags: str, default: Any, help: str, **kwargs: Any) -> None: ...


def _uids(text: str) -> tuple[int, ...]:
    try:
        uids = tuple(int(part, 10) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of "
                                         "UIDs") from None
    if not uids or any(not 0 <= uid < 1 << 32 for uid in uids):
        raise argparse.ArgumentTypeError(f"{text!r}: expected one or more UIDs "
                                         "(0 to 4294967295)")
    return uids


def add_serve_loader_flag(env: Adder) -> None:
    env.add("--loader-socket", default=None, convert=Path, metavar="PATH",
            help="with --programming on: load through the loader process (`loader`) "
                 "listening on this unix socket, rather than in this process; unset: this "
                 "process loads")


def add_loader_flags(env: Adder) -> None:
    env.add("--loader-socket", default=None, convert=Path, metavar="PATH",
            help="the unix socket to serve load requests on (its directory is made 0700, "
                 "the socket 0600, owned by the first allowed UID)")
    env.add("--loader-allowed-uids", default=DEFAULT_ALLOWED_UIDS, convert=_uids,
            help="UIDs whose connections are served, checked on each connection's peer "
                 "credentials (comma-separated; default 0, the driver's)")
    env.add("--loader-network", default="isolate", choices=LOADER_NETWORK,
            help="isolate: leave the pod's network at start (an empty network namespace of "
                 "the loader's own); keep: stay in it (where unshare is not allowed)")


def loader_problem(settings: Any) -> str | None:
    """What keeps ``loader`` from starting, in one line."""
    if settings.loader_socket is None:
        return "needs --loader-socket (or ACCELERATOR_DP_LOADER_SOCKET): the socket to serve"
    if len(str(Path(settings.loader_socket).absolute()).encode()) > 107:
        return f"--loader-socket {settings.loader_socket} is longer than a unix socket path"
    return None
