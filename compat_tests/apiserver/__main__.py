"""``python -m compat_tests.apiserver --model 1.36``: an emulated API server for manual runs.

Prints its URL, token and (with TLS) CA file, and writes a kubeconfig when asked, so a driver can
be started by hand with ``--kubeconfig`` against any release; the control API (``/_emulator/``,
also on ``--control-port``) injects faults from another shell.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from compat_tests.apiserver.models import DEFAULT_MODEL, MODELS
from compat_tests.apiserver.server import ApiServerEmulator

log = logging.getLogger(__name__)


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m compat_tests.apiserver",
        description="Emulate the resource.k8s.io API of a kube-apiserver of one release.")
    parser.add_argument("--model", default=DEFAULT_MODEL, choices=MODELS, metavar="VERSION",
                        help=f"release to behave like ({MODELS[0]} .. {MODELS[-1]}, "
                             f"default {DEFAULT_MODEL})")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: any)")
    parser.add_argument("--control-port", type=int, default=None,
                        help="also serve the control API on this port (0: any); it stays up "
                             "while the API port is down")
    parser.add_argument("--token", action="append", default=[],
                        help="accepted bearer token (repeatable; default: a random one)")
    parser.add_argument("--tls", action="store_true", help="serve HTTPS with a fresh CA")
    parser.add_argument("--tls-dir", type=Path, help="serve HTTPS; write ca.crt, server.crt, "
                        "server.key here")
    parser.add_argument("--runtime-config", default="",
                        help="e.g. resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true")
    parser.add_argument("--feature-gates", default="", help="e.g. DRADeviceTaints=false")
    parser.add_argument("--field-validation", default="Strict",
                        choices=("Strict", "Warn", "Ignore"),
                        help="what an unknown field does when the client does not say "
                             "(a real server: Warn; default here: Strict)")
    parser.add_argument("--kubeconfig-out", type=Path, help="write a kubeconfig here")
    parser.add_argument("--node", action="append", default=[],
                        help="create this Node at start (repeatable)")
    parser.add_argument("--log-level", default="info",
                        choices=("debug", "info", "warning", "error"))
    return parser.parse_args(argv)


async def run(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    api = ApiServerEmulator(
        args.model, runtime_config=args.runtime_config or None,
        feature_gates=args.feature_gates or None, port=args.port,
        tls=args.tls, tls_dir=args.tls_dir, tokens=args.token or None,
        default_field_validation=args.field_validation, control_port=args.control_port)
    async with api:
        for node in args.node:
            api.create_node(node)
        if args.kubeconfig_out:
            api.write_kubeconfig(args.kubeconfig_out)
        print(f"url={api.url}", flush=True)
        print(f"token={api.token}", flush=True)
        if api.ca_file:
            print(f"ca_file={api.ca_file}", flush=True)
        if api.control_url:
            print(f"control_url={api.control_url}", flush=True)
        if args.kubeconfig_out:
            print(f"kubeconfig={args.kubeconfig_out}", flush=True)
        log.info("emulated kube-apiserver %s serving %s; Ctrl-C to stop", api.model.name,
                 ", ".join(api.model.served) or "no resource.k8s.io version")
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(run(args))
    except ValueError as err:  # a model, runtime config or gate the server would refuse
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
