"""Command-line flags and their environment variables, parsed into one frozen settings value.

Every flag of ``serve`` can also come from ``ACCELERATOR_DP_<FLAG>`` (dashes as underscores,
upper case), because a DaemonSet is easier to tune through ``env`` than through ``args``, and
from the ``--config`` file (a ConfigMap). A flag on the command line wins over its variable,
which wins over the file (:mod:`plugin.cli.sources`). A bad flag or value exits 2 with one line.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from plugin.cli.converters import (
    BACKOFF,
    HEALTH_INTERVAL,
    INTERVAL,
    MAX_AGE,
    PROGRAM_TIMEOUT,
    TIMEOUT,
    boolean,
    byte_count,
    class_names,
    dns_label,
    dns_subdomain,
    driver_name,
    generations,
    port_number,
    replicas,
    resource_name,
    resource_prefix,
    shares,
    socket_name,
    whole_number,
)
from plugin.cli.help_formatter import HelpFormatter
from plugin.cli.loader_flags import add_loader_flags, add_serve_loader_flag
from plugin.cli.settings import (
    API_CHOICES,
    BACKEND_CHOICES,
    CDI_STRATEGIES,
    DEFAULT_DIR,
    DEFAULT_DRA_DRIVER,
    DEFAULT_GENERATIONS,
    DEFAULT_IMAGE_LIBRARY,
    DEFAULT_POD_RESOURCES_SOCKET,
    DEFAULT_PROGRAM_TIMEOUT,
    DEFAULT_REGISTRY,
    DEFAULT_RESOURCE,
    DEFAULT_SOCKET,
    DEFAULT_SPEC_DIR,
    DEFAULT_STOP_TIMEOUT,
    EVENTS_CHOICES,
    KUBELET_PLUGINS_DIR,
    REGISTRATION_MODES,
    RESOURCE_MODES,
    RUNTIME_CDI_CHOICES,
    Settings,
)
from plugin.cli.sources import CONFIG_KEY, UNSET, Option, SettingError, resolve
from plugin.cli.validation import settings_problem
from plugin.model.programming import (
    DEFAULT_MAX_IMAGE_BYTES,
    INTEL_LOADERS,
    PROGRAM_AT,
    PROGRAMMING_MODES,
)
from plugin.model.replicas import MAX_REPLICAS

if TYPE_CHECKING:
    from api_versions.retry import RetryPolicy

ENV_PREFIX = "ACCELERATOR_DP_"


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line and exits 2, as DaemonSet logs want."""

    commands: dict[str, OneLineParser]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self.options: list[Option] = []
        """What ``_EnvDefaults`` registered: the settings a variable or the file may give."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


class _Version(argparse.Action):
    """``--version``, reading the package's metadata only when asked: importlib.metadata
    costs megabytes the ``loader`` process, which never prints a version, should not hold."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> NoReturn:
        from plugin.version import VERSION

        print(f"accelerator-device-plugin {VERSION}")  # on stdout, as argparse's own does
        parser.exit()


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


def _add_node_flags(parser: OneLineParser) -> None:
    env = _EnvDefaults(parser)
    env.add("--backend", default="auto", choices=BACKEND_CHOICES,
            help="device discovery backend; auto picks what the node has")
    env.add("--accel-nbunits", "-accel-nbunits", default=40, convert=whole_number,
            help="number of AWS units 0..N-1 served by the units backend")
    env.add("--sysfs-root", default=Path("/sys"), convert=Path, help="root of sysfs")
    env.add("--dev-root", default=Path("/dev"), convert=Path, help="root of device nodes")
    env.add("--resource-mode", default="single", choices=RESOURCE_MODES,
            help="single: one resource; afu: one resource per loaded function (Intel AFU "
                 "ID, Alveo shell)")
    env.add("--resource-prefix", default="b-com.com", convert=resource_prefix,
            help="domain of the per-function resource names in afu mode")
    env.add("--resource-name", default=DEFAULT_RESOURCE, convert=resource_name,
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
    env.add("--image-max-bytes", default=DEFAULT_MAX_IMAGE_BYTES, convert=byte_count,
            help="largest image file accepted")
    env.add("--require-image-digest", default=False, convert=boolean, nargs="?", const=True,
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
    env.add("--program-at", default="prepare", choices=PROGRAM_AT,
            help="with --programming on (DRA, Kubernetes 1.36+): bind loads a claim's "
                 "function while the scheduler waits to bind its pod, and a failed load "
                 "sends the pod to another device; prepare loads it once the pod is bound")


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


def _add_replicas_flag(env: _EnvDefaults) -> None:
    """Shared by ``serve`` and ``discover``, which shows how many IDs each resource gets."""
    env.add("--replicas", default=(), convert=replicas, metavar="RESOURCE=N[,...]",
            help="device plugin: advertise each device of RESOURCE (a full resource name, or "
                 f"* for every one) N times (1 to {MAX_REPLICAS}), as <device ID>::<i>, so N "
                 "containers share it, e.g. b-com.com/accelerator=4; only for functions "
                 "several users can share (nothing divides the device)")


def _add_share_flag(env: _EnvDefaults) -> None:
    """Shared by ``serve`` and ``discover``, which says which devices would be published
    shared."""
    env.add("--dra-share", default=(), convert=shares, metavar="FAMILY=VALUE[,...]",
            help="DRA: publish the devices of FAMILY for sharing between claims, e.g. "
                 "intel=image,alveo=4. VALUE: image (as many contexts as the held function's "
                 "image serves: a GBS's total-contexts, an xclbin's compute units; only for "
                 "functions this driver loaded), a number of contexts (1: not shared), or off "
                 "(the default). Only intel and alveo can be shared; a device holding no "
                 "function, or held whole by a claim, is published whole")


def _add_serve_flags(parser: OneLineParser) -> None:
    env = _EnvDefaults(parser)
    env.add("--device-plugin-dir", default=DEFAULT_DIR, convert=Path,
            help="kubelet device-plugin directory (holds kubelet.sock)")
    env.add("--socket-name", default=DEFAULT_SOCKET, convert=socket_name,
            help="file name of this plugin's socket in that directory")
    env.add("--api-versions", default=DEFAULT_GENERATIONS, convert=generations,
            help="generations to try, in this order (default newest first)")
    _add_replicas_flag(env)
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
            convert=dns_subdomain,
            help="this node's name, for DRA (default: $NODE_NAME, which the DaemonSet sets "
                 "from the downward API)")
    env.add("--dra-driver-name", default=DEFAULT_DRA_DRIVER, convert=driver_name,
            help="the DRA driver name in ResourceSlices, claims and DeviceClasses")
    env.add("--dra-state-dir", default=None, convert=Path,
            help="where the DRA driver keeps its claim checkpoint (default "
                 f"{KUBELET_PLUGINS_DIR}/<driver name>)")
    _add_share_flag(env)
    env.add("--function-grants", default=None, convert=dns_label, metavar="NAMESPACE",
            help="DRA: the namespace of the function catalogue (the ConfigMaps labelled "
                 "app.kubernetes.io/component=function-admission; keys: guarded "
                 "DeviceClasses); a claim is then prepared on a device holding, or to be "
                 "loaded with, a function a guarded class names only in a namespace granted "
                 "such a class (label functions.accelerator.b-com.com/<class>=true), and "
                 "such devices are published functionGuarded; off by default")
    env.add("--guarded-classes", default=(), convert=class_names, metavar="CLASS[,...]",
            help="with --function-grants: the catalogue's classes as deployed, guarded "
                 "while its ConfigMap is missing (it can add classes, not take them away)")
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
    env.add("--stop-timeout", default=DEFAULT_STOP_TIMEOUT, convert=PROGRAM_TIMEOUT,
            help="seconds a stopping DRA driver waits for the loads and clears under way "
                 "before it cuts them off (their devices quarantined) and gives up its "
                 "socket; keep it below the pod's terminationGracePeriodSeconds "
                 f"({PROGRAM_TIMEOUT.describe()})")
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
    env.add("--cdi", default=False, convert=boolean, nargs="?", const=True,
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
    env.add("--retry-attempts", default=5, convert=whole_number,
            help="tries of one generation on transient failures before backing off")
    env.add("--retry-max-backoff", default=2.0, convert=BACKOFF,
            help=f"longest wait between two such tries, in seconds ({BACKOFF.describe()})")
    env.add("--heartbeat-file", default=None, convert=Path,
            help="file touched after each successful self-check (for the liveness probe)")
    env.add("--heartbeat-interval", default=10.0, convert=INTERVAL,
            help=f"seconds between self-checks ({INTERVAL.describe()})")
    env.add("--metrics-port", default=None, convert=port_number,
            help="serve Prometheus metrics on this port (off by default)")
    env.add("--metrics-address", default="0.0.0.0", help="address for the metrics port")
    env.add("--probe-port", default=None, convert=port_number,
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
    parser.add_argument("--version", action=_Version, nargs=0, dest=argparse.SUPPRESS,
                        default=argparse.SUPPRESS,
                        help="show program's version number and exit")
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
    add_serve_loader_flag(_EnvDefaults(discover))
    _add_common_flags(discover)
    found = _EnvDefaults(discover)
    _add_replicas_flag(found)
    _add_share_flag(found)
    found.add("--dra-driver-name", default=DEFAULT_DRA_DRIVER, convert=driver_name,
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
    state = _EnvDefaults(loader)
    state.add("--dra-driver-name", default=DEFAULT_DRA_DRIVER, convert=driver_name,
              help="the DRA driver the loader loads for (names its default state directory)")
    state.add("--dra-state-dir", default=None, convert=Path,
              help="the driver's state directory, where every process that may program a "
                   "card takes its lock and records each load (cards/); the driver's own, at "
                   f"the same host path (default {KUBELET_PLUGINS_DIR}/<driver name>)")
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
    if ns.command == "healthcheck" and ns.heartbeat_file is None:
        command.error("needs --heartbeat-file (or ACCELERATOR_DP_HEARTBEAT_FILE)")
    settings = Settings(retry=_retry(ns) if ns.command == "serve" else None, origins=origins,
                        **values)
    problem = settings_problem(settings)
    if problem:
        command.error(problem)
    return settings


def _retry(ns: argparse.Namespace) -> RetryPolicy:
    """``serve``'s negotiation policy from its ``--retry-*`` and ``--register-timeout``."""
    from api_versions.retry import RetryPolicy

    default = RetryPolicy()
    return RetryPolicy(
        attempts=max(1, getattr(ns, "retry_attempts", default.attempts)),
        max_backoff=getattr(ns, "retry_max_backoff", default.max_backoff),
        register_timeout=getattr(ns, "register_timeout", default.register_timeout),
    )
