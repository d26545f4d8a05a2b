"""``accelerator-device-plugin serve|discover|healthcheck|loader``."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from plugin.cli.config import Settings, parse
from plugin.discovery.backends import BackendConfig, make_backend, missing_roots
from plugin.discovery.backends.base import Backend
from plugin.process.logs import configure

if TYPE_CHECKING:
    from plugin.process.probe_server import ProbeServer
    from value_types.devices import Device

log = logging.getLogger(__name__)


def main(argv: Sequence[str] | None = None) -> int:
    # gRPC's core library logs to stderr in its own plain-text format (for example "Got
    # goaway" when a kubelet goes away mid-call), which breaks --log-format json; our own
    # logs already say what matters. Set before gRPC is first imported; an operator's value
    # wins.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    settings = parse(argv)
    configure(settings.log_level, settings.log_format)
    try:
        code = _COMMANDS[settings.command](settings)
        sys.stdout.flush()
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _reader_went_away()
    return code


def _reader_went_away() -> int:
    """``discover | head -1``: the reader closed the pipe; stop quietly, as ``cat`` would.

    Python's own recipe: point stdout at /dev/null so the flush at exit cannot raise
    again, and exit with the status a process killed by SIGPIPE reports (128 + 13).
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 141


def _backend(settings: Settings) -> Backend:
    config = BackendConfig(
        sysfs_root=settings.sysfs_root, dev_root=settings.dev_root,
        nb_units=settings.accel_nbunits,
    )
    for problem in missing_roots(settings.backend, config):
        log.warning("%s", problem)
    try:
        return make_backend(settings.backend, config)
    except ValueError as exc:
        print(f"accelerator-device-plugin: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def serve(settings: Settings) -> int:
    import asyncio  # here, as in discover: the loader command never holds asyncio

    from plugin.discovery.triggers import triggers_for
    from plugin.model.replicas import announce
    from plugin.process.daemon import Daemon
    from plugin.serving.dra.share_setting import announce as announce_shares

    announce(settings.replicas, settings.resource_mode, settings.resource_name, settings.api)
    announce_shares(settings.dra_share, settings.api)
    probes = _probe_port(settings)
    backend = _backend(settings)
    daemon = Daemon(settings, backend, triggers=triggers_for(backend), owns_process=True,
                    probes=probes)
    return asyncio.run(daemon.run())


def _probe_port(settings: Settings) -> ProbeServer | None:
    """The probe port, bound now: one the process cannot listen on ends the start (exit 2)
    rather than leave a pod whose probes can never pass, unlike the metrics port, whose
    loss costs only metrics."""
    if settings.probe_port is None:
        return None
    from plugin.process.probe_server import bind

    try:
        return bind(settings.probe_address, settings.probe_port)
    except OSError as exc:
        print(f"accelerator-device-plugin serve: error: --probe-port {settings.probe_port}: "
              f"cannot listen on {settings.probe_address}:{settings.probe_port}: "
              f"{exc.strerror or exc}", file=sys.stderr)
        raise SystemExit(2) from None


def discover(settings: Settings) -> int:
    import asyncio

    from plugin.cli.discover import render_json, render_table, replica_notes, share_notes
    from plugin.cli.sources import describe
    from plugin.discovery.monitor import DeviceMonitor
    from plugin.programming.setup import (
        functions_only_tools_tell,
        loaded_from,
        why_not_programmable,
    )

    backend = _backend(settings)
    devices = list(asyncio.run(DeviceMonitor(backend, rescan_interval=1.0).scan()))
    why_not = why_not_programmable(settings)
    told = asyncio.run(functions_only_tools_tell(settings, devices))
    records = loaded_from(settings, devices, told)
    if settings.json_output:
        # stdout stays the device list scripts parse (as in 0.1.0); where the settings came
        # from is for the person running it, on stderr.
        print(render_json(devices, why_not, told, records))
        if settings.origins:
            print(describe(settings.origins), file=sys.stderr)
    else:
        notes = replica_notes(devices, settings.replicas, settings.resource_mode,
                              settings.resource_name, settings.resource_prefix)
        notes += share_notes(devices, settings.dra_share, _shared(settings, devices))
        print(render_table(devices, settings.origins, why_not, told, records, notes))
    return 0


def _shared(settings: Settings, devices: list[Device]) -> Mapping[str, int]:
    """Device ID -> contexts of the devices ``serve`` would publish shared while no claim
    holds them: the driver's own decision, reading its load records and images as it does."""
    if not settings.dra_share:
        return {}
    from pathlib import Path

    from plugin.cli.settings import dra_state_dir
    from plugin.programming.image_checks import ImageChecks
    from plugin.programming.library import ImageLibrary
    from plugin.serving.dra.sharing import NO_HOLDS, Sharing
    from value_types.devices import DeviceSet

    checks = ImageChecks(ImageLibrary(Path(settings.image_library), settings.image_max_bytes))
    sharing = Sharing(settings.dra_share, checks, dra_state_dir(settings))
    return sharing.contexts(DeviceSet.of(devices), NO_HOLDS)


def loader(settings: Settings) -> int:
    from plugin.cli.loader import run_loader

    return run_loader(settings, _backend(settings))


def healthcheck(settings: Settings) -> int:
    from plugin.process.daemon import heartbeat_fresh

    assert settings.heartbeat_file is not None
    ok, reason = heartbeat_fresh(settings.heartbeat_file, settings.heartbeat_max_age)
    print(reason)
    return 0 if ok else 1


_COMMANDS = {"serve": serve, "discover": discover, "healthcheck": healthcheck, "loader": loader}
