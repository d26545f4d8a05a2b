"""What each emulated kubelet version does differently, as data rather than branches.

The emulator has one code path; every place where kubelets of different versions disagree
(version string, error wording, synchronous dial-back, which fields are read, what happens
when a ListAndWatch stream ends) is looked up here. A model is a Kubernetes minor version
("1.8" ... "1.38"); its generation is the device-plugin API it serves. Device-plugin
behaviour of 1.34 .. 1.38 is that of 1.33 for this project; their DRA behaviour is in
``dra_models``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum

FIRST_MINOR = 8
LAST_MINOR = 38
DEFAULT_MODEL = "1.26"

# Minor versions at which a kubelet behaviour changed (see the project's kubelet facts page).
_V1BETA1_SINCE = 10
_TOPOLOGY_SINCE = 16
_PREFERRED_ALLOCATION_SINCE = 19
_SYNCHRONOUS_REGISTER_SINCE = 26
_CDI_SINCE = 28
_PLUGINS_REGISTRY_SINCE = 13
"""The plugin watcher serves device plugins from /var/lib/kubelet/plugins_registry (1.12
had it under plugins/, which this project does not use)."""


class StreamEnd(Enum):
    """What the kubelet does with a resource's devices when its ListAndWatch stream ends."""

    DROP = "drop"
    MARK_UNHEALTHY = "mark-unhealthy"


class OptionsSource(Enum):
    """Where the kubelet learns a plugin's DevicePluginOptions."""

    NONE = "none"  # alpha generations have no options
    REGISTER_REQUEST = "register-request"  # 1.10 .. 1.25 read RegisterRequest.options
    RPC = "get-device-plugin-options"  # 1.26+ call GetDevicePluginOptions while registering


def go_quote(text: str) -> str:
    """Go's ``%q`` of a string, close enough for the ASCII names plugins send."""
    return json.dumps(text, ensure_ascii=False)


def go_quote_list(items: tuple[str, ...]) -> str:
    """Go's ``%q`` of a ``[]string``: quoted items separated by spaces inside brackets."""
    return "[" + " ".join(go_quote(item) for item in items) + "]"


@dataclass(frozen=True)
class GenerationTable:
    """Behaviour shared by every kubelet that serves one wire generation."""

    generation: str
    supported_versions: tuple[str, ...]
    stream_end: StreamEnd

    def version_error(self, requested: str, supported: tuple[str, ...]) -> str:
        """The kubelet's own message for a RegisterRequest.version it does not accept."""
        if self.generation == "v1alpha1":
            return "unsupported API version by the Kubelet registry"
        if self.generation == "v1alpha2":
            # 1.9 formats its single version constant with %q.
            shown = supported[0] if supported else ""
            return (
                f"requested API version {go_quote(requested)} is not supported by kubelet. "
                f"Supported version is {go_quote(shown)}"
            )
        return (
            f"requested API version {go_quote(requested)} is not supported by kubelet. "
            f"Supported version is {go_quote_list(supported)}"
        )

    def resource_name_error(self, name: str) -> str:
        """The kubelet's own message for a resource name that is not an extended resource."""
        if self.generation == "v1alpha1":
            return "invalid Empty ResourceName" if not name else "the ResourceName is invalid"
        return f"the ResourceName {go_quote(name)} is invalid"


GENERATIONS: dict[str, GenerationTable] = {
    "v1alpha1": GenerationTable("v1alpha1", ("0.1",), StreamEnd.DROP),
    "v1alpha2": GenerationTable("v1alpha2", ("v1alpha2",), StreamEnd.DROP),
    "v1beta1": GenerationTable("v1beta1", ("v1beta1",), StreamEnd.MARK_UNHEALTHY),
}


@dataclass(frozen=True)
class KubeletModel:
    """One kubelet version: its generation table plus the features that version reads."""

    name: str
    minor: int
    table: GenerationTable
    registers_synchronously: bool
    options_source: OptionsSource
    reads_topology: bool
    calls_preferred_allocation: bool
    reads_cdi_devices: bool
    supports_pre_start: bool
    watches_plugins_registry: bool = False

    @property
    def generation(self) -> str:
        return self.table.generation


def _generation_of(minor: int) -> str:
    if minor == 8:
        return "v1alpha1"
    if minor == 9:
        return "v1alpha2"
    return "v1beta1"


MODELS: dict[str, str] = {
    f"1.{minor}": _generation_of(minor) for minor in range(FIRST_MINOR, LAST_MINOR + 1)
}
"""Every emulated Kubernetes version and the device-plugin API generation it serves."""


def load_model(name: str) -> KubeletModel:
    """The behaviour of kubelet version ``name`` (e.g. ``"1.9"``); ValueError if unknown."""
    if name not in MODELS:
        raise ValueError(
            f"unknown kubelet model {name!r}; known: 1.{FIRST_MINOR} .. 1.{LAST_MINOR}"
        )
    minor = int(name.split(".")[1])
    beta = minor >= _V1BETA1_SINCE
    synchronous = minor >= _SYNCHRONOUS_REGISTER_SINCE
    if not beta:
        options = OptionsSource.NONE
    elif synchronous:
        options = OptionsSource.RPC
    else:
        options = OptionsSource.REGISTER_REQUEST
    return KubeletModel(
        name=name,
        minor=minor,
        table=GENERATIONS[MODELS[name]],
        registers_synchronously=synchronous,
        options_source=options,
        reads_topology=minor >= _TOPOLOGY_SINCE,
        calls_preferred_allocation=minor >= _PREFERRED_ALLOCATION_SINCE,
        reads_cdi_devices=minor >= _CDI_SINCE,
        supports_pre_start=beta,
        watches_plugins_registry=minor >= _PLUGINS_REGISTRY_SINCE,
    )
