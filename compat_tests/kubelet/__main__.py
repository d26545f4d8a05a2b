"""``python -m compat_tests.kubelet --dir D --model 1.9``: an emulated kubelet for manual runs.

Lets a person start the real plugin by hand against a kubelet of any version and read, in
the log, what that kubelet saw: registrations, refusals and every device list. With
``--plugins-registry R`` it also runs the plugin watcher, and with DRA (``--dra``, the default
from 1.34) the DRA manager: the log then tells which service it picked for each driver, the
health it heard and the ResourceSlice wipes it sent to ``--apiserver``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from collections.abc import Sequence
from pathlib import Path

from compat_tests.kubelet.dra import DraConfig
from compat_tests.kubelet.emulator import KubeletEmulator
from compat_tests.kubelet.models import DEFAULT_MODEL, MODELS
from compat_tests.kubelet.slices import http_driver_wiper, http_wiper

log = logging.getLogger(__name__)


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m compat_tests.kubelet",
        description="Emulate the device-plugin and DRA side of a kubelet of one Kubernetes "
                    "version.",
    )
    parser.add_argument("--dir", type=Path, required=True,
                        help="device-plugin directory (kubelet.sock is served there)")
    parser.add_argument("--model", default=DEFAULT_MODEL, choices=sorted(
        MODELS, key=lambda m: int(m.split(".")[1])), metavar="VERSION",
        help=f"Kubernetes version to behave like (1.8 .. 1.38, default {DEFAULT_MODEL})")
    parser.add_argument("--accept-no-version", action="store_true",
                        help="refuse every RegisterRequest.version")
    parser.add_argument("--hang-register", action="store_true",
                        help="never answer Register")
    parser.add_argument("--dial-timeout", type=float, default=10.0,
                        help="seconds to wait when dialling a plugin back")
    parser.add_argument("--plugins-registry", type=Path, default=None,
                        help="run the plugin watcher on this directory (DevicePlugin, DRAPlugin)")
    parser.add_argument("--reconcile-period", type=float, default=1.0,
                        help="seconds between the plugin watcher's looks at the directory")
    parser.add_argument("--dra", action=argparse.BooleanOptionalAction, default=None,
                        help="DynamicResourceAllocation gate (default: the release's, on 1.34+)")
    parser.add_argument("--resource-health", action=argparse.BooleanOptionalAction,
                        default=None, help="ResourceHealthStatus gate (default: on 1.36+)")
    parser.add_argument("--node-name", default="node-1",
                        help="node whose ResourceSlices the kubelet wipes")
    parser.add_argument("--apiserver", default=None, metavar="URL",
                        help="API server to wipe the node's ResourceSlices on (DELETE "
                             "/apis/resource.k8s.io/v1/resourceslices); retried while down")
    parser.add_argument("--pod-resources", type=Path, default=None, metavar="SOCKET",
                        help="serve the PodResources API (1.20+) on this socket, listing the "
                             "containers recorded in --dir's kubelet_internal_checkpoint")
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
        plugins_registry=args.plugins_registry, reconcile_period=args.reconcile_period,
        dra=dra_config(args), pod_resources_socket=args.pod_resources,
    )
    async with emulator:
        log.info("emulated kubelet %s (%s%s) ready; Ctrl-C to stop", args.model,
                 emulator.generation, ", DRA" if emulator.dra is not None else "")
        await stop.wait()


def dra_config(args: argparse.Namespace) -> DraConfig:
    """The DRA side of the command line: gates, node name, the API server to wipe slices on."""
    url = args.apiserver
    return DraConfig(
        enabled=args.dra, resource_health=args.resource_health, node_name=args.node_name,
        wipe_slices=http_wiper(url) if url else None,
        wipe_driver_slices=http_driver_wiper(url) if url else None,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
