"""What each kubelet release does differently with DRA drivers, as data rather than branches.

The emulated DRA manager (``dra.py``) has one code path; every place where kubelets 1.31 ..
1.38 disagree is looked up here: how the driver's ``supported_versions`` is read and which
service is picked (claims and health), the exact wording of a refusal, how several instances
of one driver are kept, when a driver's ResourceSlices are wiped, which feature gates exist and
their defaults,
and which newer fields the kubelet reads.

Sources (read with the search tools, not copied): k8s.io/kubernetes
``pkg/kubelet/cm/dra/plugin/registration.go`` (1.31 ``validateVersions`` with
``utilversion.HighestSupportedVersion``; 1.32-1.33 ``validateSupportedServices``),
``plugins_store.go`` (1.33), ``dra_plugin_manager.go`` and ``dra_plugin.go`` (1.34-1.36,
``servicesSupportedByKubelet``), ``pkg/kubelet/cm/dra/manager.go`` (prepare, health,
``defaultWipingDelay``); k8s.io/apimachinery v0.31.0 ``pkg/util/version/version.go``.
Health in 1.37+: k8s.io/kubelet ``pkg/apis/dra-health/v1`` (package ``v1``, service string
``"v1.DRAResourceHealth"``, k/k PR 139477) and k/k ``pkg/kubelet/cm/dra/plugin/
dra_plugin_manager_test.go`` ``TestPickHealthService`` on master after 1.37: v1 when the driver
lists it, else v1alpha1 when listed (kept "for three releases of transition", until 1.40: k/k
140838), else no stream at all. The code index holds no 1.38 kubelet; master after 1.37
(``servicesSupportedByKubelet`` still v1, v1beta1; the same health pick) stands for it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from compat_tests.kubelet.models import go_quote, go_quote_list

FIRST_DRA_MINOR = 31
"""Older kubelets speak an earlier, incompatible DRA API that this project does not serve."""
LAST_DRA_MINOR = 38

V1, V1BETA1, V1ALPHA4 = "v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha3.NodeService"
HEALTH_V1, HEALTH_V1ALPHA1 = "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"
HEALTH_SERVICE = HEALTH_V1ALPHA1
"""The one health service of 1.34 .. 1.36."""
HEALTH_PICK_SINCE = 37
"""From 1.37 the kubelet reads the health service from ``supported_versions`` (v1 first)."""

EMPTY_SERVICES = "empty list of supported gRPC services (aka supported versions)"

CALL_TIMEOUT = 45.0
"""Every NodePrepareResources / NodeUnprepareResources call (1.31+)."""
HEALTH_RETRY = 5.0
"""``wait.UntilWithContext(..., 5*time.Second)`` around NodeWatchResources (1.34+)."""
WIPING_DELAY = 30.0
"""``defaultWipingDelay``: slices of a driver whose last plugin went away (1.33+)."""


class Pick(Enum):
    """How the kubelet reads ``PluginInfo.supported_versions``."""

    SEMVER = "highest major-1 version; service strings do not parse and are skipped"  # 1.31
    KUBELET_ORDER = "v1beta1 if listed, else v1alpha4 (listed or not)"  # 1.32, 1.33
    PLUGIN_ORDER = "the plugin's first entry the kubelet knows"  # 1.34+


class Instances(Enum):
    """What a second registration of the same driver does."""

    HIGHER_VERSION = "refused unless its version is higher; then it replaces the first"  # 1.31
    NEWEST_REPLACES = "replaces the first"  # 1.32
    MANY = "kept beside the first unless it reuses its endpoint"  # 1.33+


@dataclass(frozen=True)
class Choice:
    """The outcome of reading ``supported_versions``: a service, or the kubelet's error."""

    service: str | None
    version: str | None = None
    """1.31 only: the version that won, compared when the same driver registers again."""
    error: str | None = None


# -- Go's utilversion.ParseGeneric and HighestSupportedVersion (apimachinery v0.31.0) ------------

_VERSION = re.compile(r"^\s*v?([0-9]+(?:\.[0-9]+)*)(.*)*$")


def parse_generic(text: str) -> tuple[int, ...]:
    """Go's ``ParseGeneric``: at least two numeric components; ValueError with Go's words."""
    match = _VERSION.match(text)
    if match is None:
        raise ValueError(f"could not parse {go_quote(text)} as version")
    components = match.group(1).split(".")
    if len(components) < 2:
        raise ValueError(f"illegal version string {go_quote(text)}")
    if components[0].startswith("0") and components[0] != "0":
        raise ValueError(f"illegal zero-prefixed version component {go_quote(components[0])} "
                         f"in {go_quote(text)}")
    return tuple(int(c) for c in components)


def shown_version(version: tuple[int, ...]) -> str:
    return ".".join(str(c) for c in version)


def highest_supported_version(versions: tuple[str, ...]) -> tuple[int, ...]:
    """Go's ``HighestSupportedVersion``: the highest parsable version of major <= 1, which must
    be major 1. Unparsable strings are skipped; the error names the first one in list order."""
    highest: tuple[int, ...] | None = None
    last_error = "<nil>"
    for text in reversed(versions):
        try:
            version = parse_generic(text)
        except ValueError as exc:
            last_error = str(exc)
            continue
        if version[0] > 1:
            continue
        if highest is None or version > highest:
            highest = version
    if highest is None:
        raise ValueError(f"could not find a highest supported version from versions "
                         f"([{' '.join(versions)}]) reported: {last_error}")
    if highest[0] != 1:
        raise ValueError(f"highest supported version reported is {shown_version(highest)}, "
                         "must be v1.x")
    return highest


@dataclass(frozen=True)
class DraModel:
    """The DRA behaviour of one kubelet release."""

    name: str
    minor: int
    pick: Pick
    kubelet_services: tuple[str, ...]
    """Services the kubelet can call, its own preference first."""
    instances: Instances
    dra_gate_default: bool
    """DynamicResourceAllocation: alpha 1.31, beta off 1.32-1.33, GA 1.34."""
    health_gate_default: bool | None
    """ResourceHealthStatus for DRA: None where the kubelet has no DRA health (before 1.34)."""
    driver_wipe_delay: float
    """Delay before wiping the slices of a driver whose last plugin deregistered."""
    deregister_by_endpoint: bool
    """1.33+: a vanished socket removes only its own instance; before, the driver's plugin."""
    reads_share_id: bool
    reads_health_timeout: bool
    reads_health_message: bool
    health_services: tuple[str, ...] = (HEALTH_V1ALPHA1,)
    """Health services the kubelet can call, its own preference first."""
    health_listed_only: bool = False
    """1.37+: a health stream only on a driver that lists one of ``health_services``;
    1.34-1.36 open the v1alpha1 stream on every driver, listed or not."""

    @property
    def has_health(self) -> bool:
        return self.health_gate_default is not None

    def choose(self, driver: str, versions: tuple[str, ...]) -> Choice:
        """The service this kubelet would call, or its refusal (without the endpoint part,
        which :meth:`validation_error` adds where the release names it)."""
        if self.pick is Pick.SEMVER:
            if not versions:
                return Choice(None, error=f"validating DRA plugin {go_quote(driver)}: "
                                          "empty list for supported versions")
            try:
                version = highest_supported_version(versions)
            except ValueError as exc:
                return Choice(None, error=(
                    f"validating DRA plugin {go_quote(driver)}: none of the versions specified "
                    f"{go_quote_list(versions)} are supported: {exc}"))
            return Choice(V1ALPHA4, version=shown_version(version))
        if not versions:
            return Choice(None, error=EMPTY_SERVICES)
        if self.pick is Pick.KUBELET_ORDER:
            chosen = next((s for s in self.kubelet_services if s in versions), V1ALPHA4)
            return Choice(chosen)
        chosen = next((s for s in versions if s in self.kubelet_services), None)
        if chosen is None:
            return Choice(None, error=(
                f"none of services supported by the plugin ({go_quote_list(versions)}) are "
                f"supported by the kubelet ({go_quote_list(self.kubelet_services)})"))
        return Choice(chosen)

    def validation_error(self, driver: str, endpoint: str, reason: str) -> str:
        """ValidatePlugin's error as the handler of this release words it."""
        if self.pick is Pick.SEMVER:
            return reason  # already says "validating DRA plugin ..."
        if self.minor <= 33:
            return f"invalid versions of plugin {driver}: {reason}"
        return (f"invalid supported gRPC versions of DRA driver plugin {driver} at endpoint "
                f"{endpoint}: {reason}")

    def same_endpoint_error(self, driver: str, endpoint: str) -> str:
        if self.minor <= 33:
            return f"endpoint {endpoint} already registered for plugin {driver}"
        return f"endpoint {endpoint} already registered for DRA driver plugin {driver}"

    def lower_version_error(self, driver: str, new: str, existing: str) -> str:
        """1.31: the driver is registered already with a version at least as high."""
        return (f"validating DRA plugin {go_quote(driver)}: another plugin with the same name is "
                f"already registered with a higher supported version: {go_quote(new)} < "
                f"{go_quote(existing)}")

    def health_service(self, versions: tuple[str, ...]) -> str | None:
        """The health service this kubelet streams from a driver listing ``versions``, or
        None when it opens no stream (no DRA health, or 1.37+ and none listed)."""
        if not self.has_health:
            return None
        if not self.health_listed_only:
            return self.health_services[0]
        return next((s for s in self.health_services if s in versions), None)

    def health_enabled(self, gate: bool | None) -> bool:
        """Whether the health stream is opened, given an explicit gate setting or None."""
        if not self.has_health:
            if gate:
                raise ValueError(f"kubelet {self.name} has no DRA device health (1.34+)")
            return False
        return self.health_gate_default if gate is None else gate


def load_dra_model(name: str) -> DraModel:
    """The DRA behaviour of kubelet ``name`` (``"1.31"`` .. ``"1.38"``); ValueError otherwise."""
    try:
        major, minor = (int(part) for part in name.split("."))
    except ValueError:
        raise ValueError(f"unknown kubelet model {name!r}") from None
    if major != 1 or not FIRST_DRA_MINOR <= minor <= LAST_DRA_MINOR:
        raise ValueError(f"kubelet {name} has no DRA this emulator speaks; "
                         f"known: 1.{FIRST_DRA_MINOR} .. 1.{LAST_DRA_MINOR}")
    if minor == 31:
        pick, services = Pick.SEMVER, (V1ALPHA4,)
    elif minor <= 33:
        pick, services = Pick.KUBELET_ORDER, (V1BETA1, V1ALPHA4)
    else:
        pick, services = Pick.PLUGIN_ORDER, (V1, V1BETA1)
    if minor == 31:
        instances = Instances.HIGHER_VERSION
    elif minor == 32:
        instances = Instances.NEWEST_REPLACES
    else:
        instances = Instances.MANY
    return DraModel(
        name=name,
        minor=minor,
        pick=pick,
        kubelet_services=services,
        instances=instances,
        dra_gate_default=minor >= 34,
        health_gate_default=None if minor < 34 else minor >= 36,
        driver_wipe_delay=0.0 if minor <= 32 else WIPING_DELAY,
        deregister_by_endpoint=minor >= 33,
        reads_share_id=minor >= 35,
        reads_health_timeout=minor >= 35,
        reads_health_message=minor >= 36,
        health_services=((HEALTH_V1, HEALTH_V1ALPHA1) if minor >= HEALTH_PICK_SINCE
                         else (HEALTH_V1ALPHA1,)),
        health_listed_only=minor >= HEALTH_PICK_SINCE,
    )
