"""The settings one run of the command line works with: a frozen value, and its defaults.

Kept apart from the parser (:mod:`plugin.cli.config`) because every part of the daemon reads
settings while only the command line builds them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from plugin.cli.sources import Origin
from plugin.model.programming import DEFAULT_MAX_IMAGE_BYTES
from plugin.model.replicas import Replicas

if TYPE_CHECKING:
    from api_versions.retry import RetryPolicy
    from plugin.programming.guarded import GrantsSource
    from plugin.serving.dra.share_setting import FamilyShare

DEFAULT_PROGRAM_TIMEOUT = 120.0
DEFAULT_IMAGE_LIBRARY = Path("/var/lib/accelerator-images")
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
DEFAULT_REGISTRY = Path("/var/lib/kubelet/plugins_registry")
"""The kubelet's plugin-watcher directory."""
DEFAULT_SPEC_DIR = Path("/var/run/cdi")
"""Where the container runtime reads CDI specs."""
DEFAULT_STOP_TIMEOUT = 25.0
"""Seconds a stopping DRA driver waits for its loads and clears (``--stop-timeout``), as
:mod:`plugin.serving.dra.stopping` defines it (tests/test_loader_imports.py checks)."""
REGISTRATION_MODES = ("auto", "kubelet-socket", "plugin-watcher")
CDI_STRATEGIES = ("device-specs", "cdi", "both")
RUNTIME_CDI_CHOICES = ("auto", "enabled", "disabled")
"""The values of ``--registration``, ``--device-list-strategy`` and ``--runtime-cdi``, as
the serving modules that act on them define them (tests/test_loader_imports.py checks they
agree): spelt here so that parsing settings, which the ``loader`` command does too, loads
no serving code."""


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
    replicas: Replicas = ()
    """``--replicas``: how many times each resource's devices are advertised (none: once)."""
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
    dra_share: tuple[FamilyShare, ...] = ()
    """``--dra-share``: per family, how many contexts a device is published shared with."""
    function_grants: str | None = None
    """``--function-grants``: the namespace of the function catalogue ConfigMap; None: no
    function is guarded by the driver."""
    guarded_classes: tuple[str, ...] = ()
    """The catalogue's classes as rendered, guarded while the ConfigMap is missing."""
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
    program_at: str = "prepare"
    """``bind``: with programming on, functions are loaded before pods bind (KEP-5007
    binding conditions, :mod:`plugin.serving.dra.binding`); ``prepare``: at prepare."""
    stop_timeout: float = DEFAULT_STOP_TIMEOUT
    """How long a stopping DRA driver waits for its loads and clears
    (:mod:`plugin.serving.dra.stopping`)."""
    loader_socket: Path | None = None
    """``serve``: the loader process's socket (None: load in-process); ``loader``: its own."""
    loader_allowed_uids: tuple[int, ...] = (0,)
    loader_network: str = "isolate"
    retry: RetryPolicy | None = None
    """``serve``'s ``--retry-*`` flags; None: the default policy (the other commands
    negotiate nothing, and the ``loader`` process holds no kubelet API code)."""
    origins: tuple[Origin, ...] = ()
    """Each setting not at its default and where it came from, for the start-up line."""


def dra_state_dir(settings: Settings) -> Path:
    """Where the DRA driver keeps its state: ``--dra-state-dir`` or the kubelet's plugin
    directory for the driver's name."""
    return settings.dra_state_dir or KUBELET_PLUGINS_DIR / settings.dra_driver_name


def events_enabled(settings: Settings) -> bool:
    """``--events``: ``auto`` is on wherever the process has API access (``--api dra|auto``)."""
    if settings.events == "auto":
        return settings.api != "device-plugin"
    return settings.events == "on"


def grants_source(settings: Settings) -> GrantsSource | None:
    """What ``--function-grants`` and ``--guarded-classes`` name (None: off)."""
    if settings.function_grants is None:
        return None
    from plugin.programming.guarded import GrantsSource  # only serve asks: the loader never

    return GrantsSource(settings.function_grants, settings.guarded_classes)
