"""Combinations of settings that cannot work, refused at start in one line.

Each flag's own value is checked as it is converted (:mod:`plugin.cli.converters`); what is
checked here needs several settings at once.
"""

from __future__ import annotations

from plugin.cli.loader_flags import loader_problem
from plugin.cli.settings import Settings

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
