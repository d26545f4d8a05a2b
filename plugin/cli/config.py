"""Command-line flags and their environment variables, parsed into one frozen settings value.

Every flag of ``serve`` can also come from ``ACCELERATOR_DP_<FLAG>`` (dashes as underscores,
upper case), because a DaemonSet is easier to tune through ``env`` than through ``args``, and
from the ``--config`` file (a ConfigMap). A flag on the command line wins over its variable,
which wins over the file (:mod:`plugin.cli.sources`). A bad flag or value exits 2 with one line.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from api_versions.retry import RetryPolicy
from plugin.cli.loader_flags import add_loader_flags, add_serve_loader_flag, loader_problem
from plugin.cli.sources import CONFIG_KEY, UNSET, Option, Origin, SettingError, resolve
from plugin.model.programming import (
    DEFAULT_MAX_IMAGE_BYTES,
    INTEL_LOADERS,
    PROGRAMMING_MODES,
)
from plugin.model.resource_names import dns_subdomain_problem, resource_name_problem
from plugin.serving.cdi import DEFAULT_SPEC_DIR
from plugin.serving.cdi import STRATEGIES as CDI_STRATEGIES
from plugin.serving.deviceplugin.channels import DEFAULT_REGISTRY
from plugin.serving.deviceplugin.channels import MODES as REGISTRATION_MODES
from plugin.serving.runtime_cdi import CHOICES as RUNTIME_CDI_CHOICES
from plugin.version import VERSION

DEFAULT_PROGRAM_TIMEOUT = 120.0
DEFAULT_IMAGE_LIBRARY = Path("/var/lib/accelerator-images")
ENV_PREFIX = "ACCELERATOR_DP_"
DEFAULT_DIR = Path("/var/lib/kubelet/device-plugins")
DEFAULT_RESOURCE = "b-com.com/accelerator"
DEFAULT_SOCKET = "accelerator.sock"
DEFAULT_GENERATIONS = ("v1beta1", "v1alpha2", "v1alpha1")
BACKEND_CHOICES = ("auto", "intel", "aws", "alveo", "units", "none")
RESOURCE_MODES = ("single", "afu")
API_CHOICES = ("device-plugin", "dra", "auto")
EVENTS_CHOICES = ("auto", "on", "off")
DEFAULT_DRA_DRIVER = "accelerator.b-com.com"
KUBELET_PLUGINS_DIR = Path("/var/lib/kubelet/plugins")
DEFAULT_POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")


@dataclass(frozen=True)
class Settings:
    command: str = "serve"
    device_plugin_dir: Path = DEFAULT_DIR
    resource_name: str = DEFAULT_RESOURCE
    socket_name: str = DEFAULT_SOCKET
    registration: str = "kubelet-socket"
    plugins_registry_dir: Path = DEFAULT_REGISTRY
    watcher_wait: float = 5.0
    cdi: bool = False
    cdi_spec_dir: Path = DEFAULT_SPEC_DIR
    device_list_strategy: str = "both"
    api_versions: tuple[str, ...] = DEFAULT_GENERATIONS
    backend: str = "auto"
    accel_nbunits: int = 40
    sysfs_root: Path = Path("/sys")
    dev_root: Path = Path("/dev")
    resource_mode: str = "single"
    resource_prefix: str = "b-com.com"
    rescan_interval: float | None = None
    """None: 30 s while every event source listens, 5 s while one cannot."""
    health_interval: float = 0.5
    scan_stall_timeout: float = 10.0
    kubelet_check_interval: float = 5.0
    heartbeat_file: Path | None = None
    heartbeat_interval: float = 10.0
    heartbeat_max_age: float = 60.0
    metrics_port: int | None = None
    metrics_address: str = "0.0.0.0"
    probe_port: int | None = None
    probe_address: str = "0.0.0.0"
    log_level: str = "info"
    log_format: str = "text"
    json_output: bool = False
    api: str = "device-plugin"
    node_name: str | None = None
    dra_driver_name: str = DEFAULT_DRA_DRIVER
    dra_state_dir: Path | None = None
    """None: ``/var/lib/kubelet/plugins/<driver name>``."""
    pod_resources_socket: Path = DEFAULT_POD_RESOURCES_SOCKET
    """The kubelet's PodResources socket: which devices running containers hold through
    the device plugin (and, 1.34+, through DRA claims), so a move never hands them out."""
    kubeconfig: Path | None = None
    api_request_timeout: float = 10.0
    runtime_cdi: str = "auto"
    """Whether the node's runtime applies CDI: ``auto`` judges from its version."""
    events: str = "auto"
    """``auto``: Kubernetes Events where the process has API access (``--api dra|auto``)."""
    programming: str = "off"
    """``on``: a claim's function is loaded onto devices that do not hold it (DRA), and
    devices with a loader on this node are published (and shown) programmable."""
    image_library: Path = DEFAULT_IMAGE_LIBRARY
    image_max_bytes: int = DEFAULT_MAX_IMAGE_BYTES
    require_image_digest: bool = False
    """A function loaded from an image must pin its bytes (``sha256``)."""
    intel_loader: str = "ioctl"
    fpgaconf: Path = Path("/usr/bin/fpgaconf")
    xbutil: Path = Path("/opt/xilinx/xrt/bin/xbutil")
    fpga_load_local_image: Path = Path("/usr/bin/fpga-load-local-image")
    fpga_describe_local_image: Path = Path("/usr/bin/fpga-describe-local-image")
    program_timeout: float = DEFAULT_PROGRAM_TIMEOUT
    loader_socket: Path | None = None
    """``serve``: the loader process's socket (None: load in-process); ``loader``: its own."""
    loader_allowed_uids: tuple[int, ...] = (0,)
    loader_network: str = "isolate"
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    origins: tuple[Origin, ...] = ()
    """Each setting not at its default and where it came from, for the start-up line."""


def dra_state_dir(settings: Settings) -> Path:
    """Where the DRA driver keeps its state: ``--dra-state-dir`` or the kubelet's plugin
    directory for the driver's name."""
    return settings.dra_state_dir or KUBELET_PLUGINS_DIR / settings.dra_driver_name


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line and exits 2, as DaemonSet logs want."""

    commands: dict[str, OneLineParser]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.options: list[Option] = []
        """What ``_EnvDefaults`` registered: the settings a variable or the file may give."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


@dataclass(frozen=True)
class Seconds:
    """A duration flag's converter: a finite number of seconds within ``[low, high]``.

    ``nan`` and ``inf`` parse as floats but make no duration (``--register-timeout nan``
    never registered), and an interval of a nanosecond turns a re-read into a busy loop, so
    every duration is finite and bounded; the bounds are shown in each flag's help.
    """

    low: float
    high: float

    def __call__(self, text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number of seconds")
        if not self.low <= value <= self.high:
            raise argparse.ArgumentTypeError(
                f"{text!r} must be between {self.low:g} and {self.high:g} seconds")
        return value

    def describe(self) -> str:
        return f"{self.low:g} to {self.high:g}"


INTERVAL = Seconds(0.1, 3600)
HEALTH_INTERVAL = Seconds(0.05, 60)
TIMEOUT = Seconds(0.1, 300)
BACKOFF = Seconds(0.01, 300)
MAX_AGE = Seconds(1, 86400)
PROGRAM_TIMEOUT = Seconds(1, 3600)


def _count(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 0 <= value <= 4096:
        raise argparse.ArgumentTypeError(f"{text!r} must be between 0 and 4096")
    return value


def _byte_count(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of bytes") from None
    if not 4096 <= value <= 1 << 40:
        raise argparse.ArgumentTypeError(f"{text!r} must be between 4096 and {1 << 40}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} must be between 1 and 65535")
    return value


def _generations(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in DEFAULT_GENERATIONS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected a comma-separated list of {', '.join(DEFAULT_GENERATIONS)}"
        )
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"{text!r} names a generation twice")
    return names


def _socket_name(text: str) -> str:
    if not text or "/" in text or text in (".", "..") or text == "kubelet.sock":
        raise argparse.ArgumentTypeError(
            f"{text!r} must be a plain file name other than kubelet.sock"
        )
    return text


def _resource_name(text: str) -> str:
    problem = resource_name_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def _dns_subdomain(text: str) -> str:
    """A node or DRA driver name: what the API server accepts for either."""
    problem = dns_subdomain_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def _driver_name(text: str) -> str:
    text = _dns_subdomain(text)
    if len(text) > 63:
        raise argparse.ArgumentTypeError(f"{text!r} is longer than the 63 characters a DRA "
                                         "driver name may have")
    return text


def _resource_prefix(text: str) -> str:
    from plugin.model.resources import prefix_problem

    problem = prefix_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def _env(flag: str) -> str:
    return ENV_PREFIX + flag.lstrip("-").replace("-", "_").upper()


class _EnvDefaults:
    """Adds options whose defaults come from the environment or the file, converted like the flag.

    Variables and the file are read once the command line is, by the subcommand that runs
    (:func:`plugin.cli.sources.resolve`): a bad variable is blamed on that subcommand, only
    if its flag was not given, and a variable only ``serve`` reads cannot break
    ``healthcheck``.
    """

    def __init__(self, parser: OneLineParser) -> None:
        self.parser = parser

    def add(
        self,
        *flags: str,
        default: Any,
        convert: Callable[[str], Any] = str,
        help: str,
        **kwargs: Any,
    ) -> None:
        variable = _env(flags[0])
        action = self.parser.add_argument(
            *flags, default=UNSET, type=convert, help=f"{help} [env {variable}]", **kwargs
        )
        self.parser.options.append(Option(
            key=flags[0].lstrip("-"), dest=action.dest, variable=variable, default=default,
            convert=convert, choices=kwargs.get("choices")))


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not true or false")


def _add_node_flags(parser: OneLineParser) -> None:
    env = _EnvDefaults(parser)
    env.add("--backend", default="auto", choices=BACKEND_CHOICES,
            help="device discovery backend; auto picks what the node has")
    env.add("--accel-nbunits", "-accel-nbunits", default=40, convert=_count,
            help="number of AWS units 0..N-1 served by the units backend")
    env.add("--sysfs-root", default=Path("/sys"), convert=Path, help="root of sysfs")
    env.add("--dev-root", default=Path("/dev"), convert=Path, help="root of device nodes")
    env.add("--resource-mode", default="single", choices=RESOURCE_MODES,
            help="single: one resource; afu: one resource per loaded function (Intel AFU "
                 "ID, Alveo shell)")
    env.add("--resource-prefix", default="b-com.com", convert=_resource_prefix,
            help="domain of the per-function resource names in afu mode")
    env.add("--resource-name", default=DEFAULT_RESOURCE, convert=_resource_name,
            help="extended resource name advertised in single mode")


def _add_programming_flag(parser: OneLineParser) -> None:
    """Shared by ``serve`` and ``discover``, so ``discover`` answers as the daemon would."""
    env = _EnvDefaults(parser)
    env.add("--programming", default="off", choices=PROGRAMMING_MODES,
            help="on (DRA): a device whose claim's configuration names a function it does "
                 "not hold is loaded with it at prepare, and devices a loader here can "
                 "program are published programmable true; off: nothing is ever loaded, "
                 "and a claim whose device lacks its function is refused")
    env.add("--image-library", default=DEFAULT_IMAGE_LIBRARY, convert=Path,
            help="the directory of image files (GBS, xclbin) claims may name; nothing "
                 "outside it is ever read")
    env.add("--image-max-bytes", default=DEFAULT_MAX_IMAGE_BYTES, convert=_byte_count,
            help="largest image file accepted")
    env.add("--require-image-digest", default=False, convert=_bool, nargs="?", const=True,
            help="refuse any function loaded from an image whose configuration does not pin "
                 "its content with sha256")
    env.add("--intel-loader", default="ioctl", choices=INTEL_LOADERS,
            help="how Intel ports are programmed: ioctl (the FME's port-PR ioctl, no tool "
                 "needed) or fpgaconf (OPAE's tool, at --fpgaconf)")
    env.add("--fpgaconf", default=Path("/usr/bin/fpgaconf"), convert=Path,
            help="OPAE's fpgaconf (with --intel-loader fpgaconf)")
    env.add("--xbutil", default=Path("/opt/xilinx/xrt/bin/xbutil"), convert=Path,
            help="XRT's xbutil, which loads xclbins onto Alveo cards")
    env.add("--fpga-load-local-image", default=Path("/usr/bin/fpga-load-local-image"),
            convert=Path, help="the AWS FPGA SDK's fpga-load-local-image")
    env.add("--fpga-describe-local-image", default=Path("/usr/bin/fpga-describe-local-image"),
            convert=Path, help="the AWS FPGA SDK's fpga-describe-local-image")
    env.add("--program-timeout", default=DEFAULT_PROGRAM_TIMEOUT, convert=PROGRAM_TIMEOUT,
            help="seconds one load may take, until the device reports its new function "
                 f"({PROGRAM_TIMEOUT.describe()})")


def _add_common_flags(parser: OneLineParser) -> None:
    env = _EnvDefaults(parser)
    env.add("--log-level", default="info", choices=("debug", "info", "warning", "error"),
            help="log verbosity")
    env.add("--log-format", default="text", choices=("text", "json"), help="log line format")


def _add_config_flag(parser: OneLineParser) -> None:
    _EnvDefaults(parser).add(
        "--config", default=None, convert=Path, metavar="FILE",
        help="YAML file of settings, keyed by these flags' names without dashes (a flag or "
             "variable wins over the file)")


def _add_serve_flags(parser: OneLineParser) -> None:
    env = _EnvDefaults(parser)
    env.add("--device-plugin-dir", default=DEFAULT_DIR, convert=Path,
            help="kubelet device-plugin directory (holds kubelet.sock)")
    env.add("--socket-name", default=DEFAULT_SOCKET, convert=_socket_name,
            help="file name of this plugin's socket in that directory")
    env.add("--api-versions", default=DEFAULT_GENERATIONS, convert=_generations,
            help="generations to try, in this order (default newest first)")
    env.add("--registration", default="kubelet-socket", choices=REGISTRATION_MODES,
            help="kubelet-socket: call Register on kubelet.sock (every kubelet); "
                 "plugin-watcher: a socket in --plugins-registry-dir that the kubelet finds "
                 "(1.13+, v1beta1 only); auto: the watcher where the kubelet takes it, "
                 "kubelet.sock otherwise, decided anew for each kubelet")
    env.add("--plugins-registry-dir", default=DEFAULT_REGISTRY, convert=Path,
            help="the kubelet's plugin-watcher directory")
    env.add("--api", default="device-plugin", choices=API_CHOICES,
            help="how the node's kubelet gets the devices: device-plugin (every kubelet), "
                 "dra (Dynamic Resource Allocation: ResourceSlices in the API server and the "
                 "kubelet's DRA service, 1.32+), or auto (DRA where the kubelet, the API "
                 "server and a DeviceClass allow it, the device plugin otherwise)")
    env.add("--node-name", default=os.environ.get("NODE_NAME") or None,
            convert=_dns_subdomain,
            help="this node's name, for DRA (default: $NODE_NAME, which the DaemonSet sets "
                 "from the downward API)")
    env.add("--dra-driver-name", default=DEFAULT_DRA_DRIVER, convert=_driver_name,
            help="the DRA driver name in ResourceSlices, claims and DeviceClasses")
    env.add("--dra-state-dir", default=None, convert=Path,
            help="where the DRA driver keeps its claim checkpoint (default "
                 f"{KUBELET_PLUGINS_DIR}/<driver name>)")
    env.add("--pod-resources-socket", default=DEFAULT_POD_RESOURCES_SOCKET, convert=Path,
            help="the kubelet's PodResources socket (--api dra|auto): devices running "
                 "containers still hold through the other API are not offered after a move "
                 "until released; where it cannot be read, every device is offered")
    env.add("--kubeconfig", default=None, convert=Path,
            help="kubeconfig for the API server (DRA); in a pod, its service account is used")
    env.add("--api-request-timeout", default=10.0, convert=TIMEOUT,
            help="seconds one API server call (DRA, Events) may take before it counts as "
                 "failed: publishing retries it with back-off, a claim read is that claim's "
                 f"error, an Event is retried with back-off ({TIMEOUT.describe()})")
    env.add("--runtime-cdi", default="auto", choices=RUNTIME_CDI_CHOICES,
            help="whether the node's container runtime applies CDI, which DRA needs: auto "
                 "(from the Node's containerRuntimeVersion: containerd 2.0+ and CRI-O 1.23+ "
                 "do; containerd 1.7 only with enable_cdi, so declare it), enabled, disabled; "
                 "--api auto keeps a node without it on the device plugin")
    env.add("--events", default="auto", choices=EVENTS_CHOICES,
            help="Kubernetes Events on the Node (a device turning Unhealthy or Healthy, the "
                 "node moving between the device plugin and DRA): auto (on with --api dra or "
                 "auto), on (also for the device plugin; needs --node-name and API access), "
                 "off")
    env.add("--cdi", default=False, convert=_bool, nargs="?", const=True,
            help="write a CDI spec per resource and name allocated devices in cdi_devices "
                 "(kubelets 1.28+); needs a runtime with CDI enabled (containerd 1.7+, "
                 "CRI-O 1.23+), so off unless asked")
    env.add("--cdi-spec-dir", default=DEFAULT_SPEC_DIR, convert=Path,
            help="where the CDI specs go (a directory the container runtime reads)")
    env.add("--device-list-strategy", default="both", choices=CDI_STRATEGIES,
            help="with --cdi, what Allocate names devices with: both (DeviceSpecs too, for "
                 "kubelets before 1.28), cdi (CDI names only) or device-specs")
    env.add("--watcher-wait", default=5.0, convert=TIMEOUT,
            help="seconds auto waits for a kubelet to register the watcher socket before "
                 f"registering through kubelet.sock ({TIMEOUT.describe()})")
    env.add("--rescan-interval", default=None, convert=INTERVAL,
            help="seconds between safety-net rescans of sysfs; by default 30 while kernel "
                 "uevents and inotify are received, 5 while they cannot be "
                 f"({INTERVAL.describe()})")
    env.add("--health-interval", default=0.5, convert=HEALTH_INTERVAL,
            help="seconds between re-reads of the files that decide health (AFU ID, errors; "
            f"{HEALTH_INTERVAL.describe()})")
    env.add("--scan-stall-timeout", default=10.0, convert=INTERVAL,
            help="seconds a sysfs scan or re-read may hang before every device is reported "
            f"Unhealthy until scans complete again ({INTERVAL.describe()})")
    env.add("--kubelet-check-interval", default=5.0, convert=INTERVAL,
            help="seconds between safety-net checks for a restarted kubelet "
            f"({INTERVAL.describe()})")
    env.add("--register-timeout", default=15.0, convert=TIMEOUT,
            help="deadline of one Register call (recent kubelets dial back within it; "
            f"{TIMEOUT.describe()})")
    env.add("--retry-attempts", default=5, convert=_count,
            help="tries of one generation on transient failures before backing off")
    env.add("--retry-max-backoff", default=2.0, convert=BACKOFF,
            help=f"longest wait between two such tries, in seconds ({BACKOFF.describe()})")
    env.add("--heartbeat-file", default=None, convert=Path,
            help="file touched after each successful self-check (for the liveness probe)")
    env.add("--heartbeat-interval", default=10.0, convert=INTERVAL,
            help=f"seconds between self-checks ({INTERVAL.describe()})")
    env.add("--metrics-port", default=None, convert=_port,
            help="serve Prometheus metrics on this port (off by default)")
    env.add("--metrics-address", default="0.0.0.0", help="address for the metrics port")
    env.add("--probe-port", default=None, convert=_port,
            help="answer GET /livez, /healthz and /readyz over HTTP on this port, for the "
                 "kubelet's httpGet probes (off by default)")
    env.add("--probe-address", default="0.0.0.0", help="address for the probe port")
    env.add("--heartbeat-max-age", default=60.0, convert=MAX_AGE,
            help="oldest self-check /livez accepts, in seconds, as healthcheck does "
                 f"({MAX_AGE.describe()})")


def build_parser() -> OneLineParser:
    parser = OneLineParser(
        prog="accelerator-device-plugin",
        description="Kubernetes device plugin for FPGA accelerators, for every kubelet API "
        "generation (v1alpha1, v1alpha2, v1beta1).",
    )
    parser.add_argument("--version", action="version",
                        version=f"accelerator-device-plugin {VERSION}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)

    serve = commands.add_parser("serve", help="register with the kubelet and serve devices")
    _add_config_flag(serve)
    _add_node_flags(serve)
    _add_serve_flags(serve)
    _add_programming_flag(serve)
    add_serve_loader_flag(_EnvDefaults(serve))
    _add_common_flags(serve)

    discover = commands.add_parser("discover", help="print the devices that would be served")
    _add_config_flag(discover)
    _add_node_flags(discover)
    _add_programming_flag(discover)
    _add_common_flags(discover)
    found = _EnvDefaults(discover)
    found.add("--dra-driver-name", default=DEFAULT_DRA_DRIVER, convert=_driver_name,
              help="the DRA driver whose record of loads to read")
    found.add("--dra-state-dir", default=None, convert=Path,
              help="where that driver keeps its state, with what it loaded onto each device "
                   f"(default {KUBELET_PLUGINS_DIR}/<driver name>)")
    discover.add_argument("--json", dest="json_output", action="store_true",
                          help="print JSON instead of a table")

    loader = commands.add_parser("loader", help="the privileged loader process: load "
                                 "functions for serve --loader-socket, nothing else")
    _add_config_flag(loader)
    _add_node_flags(loader)
    _add_programming_flag(loader)
    add_loader_flags(_EnvDefaults(loader))
    _add_common_flags(loader)

    health = commands.add_parser("healthcheck", help="exit 0 if the heartbeat file is fresh")
    env = _EnvDefaults(health)
    env.add("--heartbeat-file", default=None, convert=Path, help="file written by serve")
    env.add("--heartbeat-max-age", default=60.0, convert=MAX_AGE,
            help=f"oldest acceptable heartbeat, in seconds ({MAX_AGE.describe()})")
    parser.commands = {"serve": serve, "discover": discover, "healthcheck": health,
                       "loader": loader}
    return parser


def parse(argv: Sequence[str] | None = None) -> Settings:
    """Parse ``argv`` (default ``sys.argv[1:]``); exit 2 with one line on any mistake."""
    parser = build_parser()
    ns = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    command = parser.commands[ns.command]
    readers = {name: sub for name, sub in parser.commands.items()
               if any(o.key == CONFIG_KEY for o in sub.options)}
    try:
        origins = resolve(ns, command.options,
                          {o.key: o for sub in readers.values() for o in sub.options},
                          list(readers), os.environ)
    except SettingError as exc:
        command.error(str(exc))
    values = {k: v for k, v in vars(ns).items() if k in Settings.__dataclass_fields__}
    default = RetryPolicy()
    retry = RetryPolicy(
        attempts=max(1, getattr(ns, "retry_attempts", default.attempts)),
        max_backoff=getattr(ns, "retry_max_backoff", default.max_backoff),
        register_timeout=getattr(ns, "register_timeout", default.register_timeout),
    )
    if ns.command == "healthcheck" and ns.heartbeat_file is None:
        command.error("needs --heartbeat-file (or ACCELERATOR_DP_HEARTBEAT_FILE)")
    settings = Settings(retry=retry, origins=origins, **values)
    problem = settings_problem(settings)
    if problem:
        command.error(problem)
    return settings


AFU_BACKENDS = ("auto", "intel", "alveo")
"""Backends whose devices say what is loaded on them (an Intel AFU ID, an Alveo shell),
which ``--resource-mode afu`` groups by."""


def settings_problem(settings: Settings) -> str | None:
    """What makes a combination of flags unusable, in one line; None when it is fine."""
    if settings.command == "loader":
        return loader_problem(settings)
    if settings.command not in ("serve", "discover"):
        return None
    if settings.resource_mode == "afu" and settings.backend not in AFU_BACKENDS:
        return (f"--resource-mode afu groups devices by what is loaded on them (AFU ID, "
                f"shell), which the {settings.backend} backend does not read; use --backend "
                f"{', '.join(AFU_BACKENDS)}, or --resource-mode single")
    if settings.command == "serve" and settings.device_list_strategy == "cdi" and \
            not settings.cdi:
        return "--device-list-strategy cdi needs --cdi (devices would be named nowhere)"
    if settings.command == "serve" and settings.registration == "plugin-watcher" and \
            "v1beta1" not in settings.api_versions:
        return ("--registration plugin-watcher registers v1beta1 only; add it to "
                "--api-versions or use --registration kubelet-socket or auto")
    if settings.command == "serve" and settings.api != "device-plugin" and \
            not settings.node_name:
        return (f"--api {settings.api} needs --node-name (or NODE_NAME from the downward "
                "API): slices and claims are per node")
    if settings.command == "serve" and settings.events == "on" and not settings.node_name:
        return ("--events on needs --node-name (or NODE_NAME from the downward API): the "
                "Events are about the node")
    if settings.command == "serve":
        return probe_problem(settings) or socket_path_problem(settings)
    return None


def probe_problem(settings: Settings) -> str | None:
    """The probe port shares nothing with the metrics port, and /livez needs room for a
    self-check to come round before it counts the last one as too old."""
    if settings.probe_port is None:
        return None
    if settings.probe_port == settings.metrics_port:
        return (f"--probe-port and --metrics-port are both {settings.probe_port}; give the "
                "probes a port of their own")
    if settings.heartbeat_max_age < 2 * settings.heartbeat_interval:
        return (f"--heartbeat-max-age {settings.heartbeat_max_age:g} must be at least twice "
                f"--heartbeat-interval {settings.heartbeat_interval:g}, or /livez fails "
                "between two self-checks")
    return None


def events_enabled(settings: Settings) -> bool:
    """``--events``: ``auto`` is on wherever the process has API access (``--api dra|auto``)."""
    if settings.events == "auto":
        return settings.api != "device-plugin"
    return settings.events == "on"


def socket_path_problem(settings: Settings) -> str | None:
    """A socket path longer than a unix socket address can hold cannot even be bound."""
    from plugin.model.resources import longest_socket_name

    name = longest_socket_name(settings.socket_name, settings.resource_mode,
                               settings.resource_prefix)
    directory = settings.device_plugin_dir
    if settings.registration != "kubelet-socket" and len(str(
            settings.plugins_registry_dir.absolute())) > len(str(directory.absolute())):
        directory = settings.plugins_registry_dir
    path = str((directory / name).absolute())
    length = len(path.encode())
    if length <= MAX_SOCKET_PATH:
        return None
    which = "the socket path" if name == settings.socket_name else "the longest socket path"
    return (f"{which} {path} is {length} bytes; a unix socket path can have at most "
            f"{MAX_SOCKET_PATH}: shorten the directory or --socket-name")


MAX_SOCKET_PATH = 107
"""``sun_path`` holds 108 bytes on Linux, one of them the terminating NUL."""
