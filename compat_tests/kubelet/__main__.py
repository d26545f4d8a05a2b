"""``python -m compat_tests.kubelet --dir D --model 1.9``: an emulated kubelet for manual runs.

Lets a person start the real plugin by hand against a kubelet of any version and read, in
the log, what that kubelet saw: registrations, refusals and every device list.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from collections.abc import Sequence
from pathlib import Path

from compat_tests.kubelet.emulator import KubeletEmulator
from compat_tests.kubelet.models import DEFAULT_MODEL, MODELS

log = logging.getLogger(__name__)


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m compat_tests.kubelet",
        description="Emulate the device-plugin side of a kubelet of one Kubernetes version.",
    )
    parser.add_argument("--dir", type=Path, required=True,
                        help="device-plugin directory (kubelet.sock is served there)")
    parser.add_argument("--model", default=DEFAULT_MODEL, choices=sorted(
        MODELS, key=lambda m: int(m.split(".")[1])), metavar="VERSION",
        help=f"Kubernetes version to behave like (1.8 .. 1.37, default {DEFAULT_MODEL})")
    parser.add_argument("--accept-no-version", action="store_true",
                        help="refuse every RegisterRequest.version")
    parser.add_argument("--hang-register", action="store_true",
                        help="never answer Register")
    parser.add_argument("--dial-timeout", type=float, default=10.0,
                        help="seconds to wait when dialling a plugin back")
    parser.add_argument("--log-level", default="info",
                        choices=("debug", "info", "warning", "error"))
    return parser.parse_args(argv)


async def run(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    emulator = KubeletEmulator(
        args.dir, args.model, accept_no_version=args.accept_no_version,
        hang_register=args.hang_register, dial_timeout=args.dial_timeout,
    )
    async with emulator:
        log.info("emulated kubelet %s (%s) ready; Ctrl-C to stop",
                 args.model, emulator.generation)
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
