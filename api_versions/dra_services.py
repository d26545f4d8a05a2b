"""Which DRA gRPC services a driver offers a kubelet, in what order, and the wire of each.

A DRA driver registers through the plugin watcher with ``PluginInfo{type: "DRAPlugin"}`` and
names every gRPC service it serves in ``supported_versions``; each kubelet release reads that
list its own way (1.31 parses it as semver, 1.32-1.33 look for their favourite, 1.34+ take the
driver's first known entry) and then calls one service's paths. This module says, as data,
what the driver advertises and which :class:`~api_versions.wire.WireApi` serves the service a
kubelet picked. It knows no devices: the adapters that fill these messages live elsewhere.

Sources: k8s.io/kubelet ``pkg/apis/dra/{v1alpha4,v1beta1,v1}/types.go`` and
``pkg/apis/dra-health/{v1alpha1,v1}/types.go`` (the service strings), k8s.io/kubernetes
``pkg/kubelet/cm/dra/plugin`` of 1.31-1.36 (how each release picks) and, for the health service
of 1.37+, ``dra_plugin_manager_test.go`` ``TestPickHealthService`` (v1 when listed, else
v1alpha1 when listed, else no stream).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from api_versions.wire import Method, WireApi

DRA_PLUGIN_TYPE = "DRAPlugin"
"""``PluginInfo.type`` of a DRA driver (``pluginwatcherapi.DRAPlugin`` upstream)."""

SEMVER_FOR_1_31 = "1.0.0"
"""1.31 parses ``supported_versions`` as versions and needs one with major 1; it skips the
service strings, which do not parse. Later kubelets skip this entry as an unknown service."""


class Role(Enum):
    """What a service is for: preparing claims, or streaming device health."""

    PLUGIN = "plugin"
    HEALTH = "health"


@dataclass(frozen=True)
class DraService:
    """One gRPC service a DRA driver can serve, as named in ``supported_versions``."""

    name: str
    """The string in ``supported_versions``: ``"<gRPC package's last element>.<service>"``."""
    wire: str
    """The descriptor set under ``protos/`` (``WireApi.load(wire)``)."""
    service: str
    """The service's name inside its proto package."""
    role: Role
    kubelets: str
    """The kubelet releases that call it, for the reader."""

    def load(self) -> WireApi:
        return WireApi.load(self.wire)

    def methods(self) -> dict[str, Method]:
        """The service's RPCs keyed by method name, each with its full path."""
        return self.load().methods(self.service)


V1 = DraService("v1.DRAPlugin", "dra_v1", "DRAPlugin", Role.PLUGIN, "1.34+")
V1BETA1 = DraService("v1beta1.DRAPlugin", "dra_v1beta1", "DRAPlugin", Role.PLUGIN,
                     "1.32+ (deprecated by v1 in 1.34)")
V1ALPHA4 = DraService("v1alpha3.NodeService", "dra_v1alpha4", "Node", Role.PLUGIN,
                      "1.31 (without asking), 1.32-1.33 when listed and v1beta1 is not")
HEALTH_V1ALPHA1 = DraService("v1alpha1.DRAResourceHealth", "dra_health_v1alpha1",
                             "DRAResourceHealth", Role.HEALTH,
                             "1.34+ with the ResourceHealthStatus gate (on by default 1.36+); "
                             "1.37+ only when v1 is not listed (accepted until 1.40)")
HEALTH_V1 = DraService("v1.DRAResourceHealth", "dra_health_v1", "DRAResourceHealth",
                       Role.HEALTH, "1.37+ when listed (preferred over v1alpha1)")

SERVICES: dict[str, DraService] = {
    s.name: s for s in (V1, V1BETA1, V1ALPHA4, HEALTH_V1, HEALTH_V1ALPHA1)}
"""Every service this project can serve, by its ``supported_versions`` string."""

SUPPORTED_VERSIONS: tuple[str, ...] = (
    V1.name,
    V1BETA1.name,
    V1ALPHA4.name,
    HEALTH_V1.name,
    HEALTH_V1ALPHA1.name,
    SEMVER_FOR_1_31,
)
"""What the driver puts in ``PluginInfo.supported_versions``, most preferred first.

1.34+ take the first entry they know (v1); 1.32-1.33 prefer v1beta1 whatever the order;
1.31 reads only ``"1.0.0"`` and calls v1alpha4, whose messages are v1beta1's, so serving it
costs one more set of handlers. The health entries matter from 1.37: that kubelet opens a
health stream only on a driver that lists a health service, on v1 when listed and on v1alpha1
otherwise, whatever their order; 1.34-1.36 open the v1alpha1 stream on every registered
driver whether it is listed or not. Both are served on the same socket."""

PLUGIN_SERVICES: tuple[DraService, ...] = tuple(
    SERVICES[name] for name in SUPPORTED_VERSIONS
    if name in SERVICES and SERVICES[name].role is Role.PLUGIN
)
"""The claim-preparing services the driver serves, most preferred first."""

HEALTH_SERVICES: tuple[DraService, ...] = tuple(
    SERVICES[name] for name in SUPPORTED_VERSIONS
    if name in SERVICES and SERVICES[name].role is Role.HEALTH
)
"""The health services the driver serves (when it has health), most preferred first."""


class UnknownService(ValueError):
    """A service string this project does not serve."""


def service_named(name: str) -> DraService:
    """The service a kubelet picked (``"v1.DRAPlugin"``, ...); UnknownService otherwise."""
    try:
        return SERVICES[name]
    except KeyError:
        raise UnknownService(
            f"{name!r} is not a DRA service this driver serves; known: {sorted(SERVICES)}"
        ) from None


def wire_for(name: str) -> WireApi:
    """The wire of the service a kubelet picked, e.g. ``wire_for("v1beta1.DRAPlugin")``."""
    return service_named(name).load()


def service_for_path(path: str) -> DraService | None:
    """The service a gRPC method path belongs to (``/v1alpha3.Node/NodePrepareResources``)."""
    for service in SERVICES.values():
        if any(m.path == path for m in service.methods().values()):
            return service
    return None
