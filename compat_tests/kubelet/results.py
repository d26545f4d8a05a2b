"""Plain Python values the emulator hands to tests, the same for every wire generation.

Tests compare what kubelets of different versions saw; translating each generation's wire
answer into these shapes once, here, keeps the tests free of protobuf types.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import grpc

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


@dataclass(frozen=True)
class EmulatedDevice:
    """A device as the kubelet keeps it: ID, health, NUMA nodes (empty where unread)."""

    id: str
    health: str
    numa_nodes: tuple[int, ...] = ()

    @property
    def healthy(self) -> bool:
        return self.health == HEALTHY


class DeviceNode(NamedTuple):
    """A DeviceSpec: compares equal to ``(container_path, host_path, permissions)``."""

    container_path: str
    host_path: str
    permissions: str


class MountEntry(NamedTuple):
    """A Mount: compares equal to ``(container_path, host_path, read_only)``."""

    container_path: str
    host_path: str
    read_only: bool


@dataclass(frozen=True)
class ContainerAllocation:
    """What one container receives from Allocate, whatever generation produced it."""

    envs: dict[str, str] = field(default_factory=dict)
    devices: list[DeviceNode] = field(default_factory=list)
    mounts: list[MountEntry] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)
    cdi_devices: list[str] = field(default_factory=list)
    pre_started: bool = False


@dataclass(frozen=True)
class RegistrationRecord:
    """One Register call the kubelet received, accepted or not."""

    resource_name: str
    endpoint: str
    version: str
    generation: str
    accepted: bool = True
    error: str | None = None
    channel: str = "kubelet.sock"
    """``kubelet.sock`` (Register) or ``plugin-watcher`` (a socket in plugins_registry)."""


class KubeletError(Exception):
    """Something the kubelet would have reported while talking to a plugin."""


class PluginCallError(KubeletError):
    """A plugin RPC failed; carries the gRPC status so tests can assert on it."""

    def __init__(self, method: str, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{method} failed: {code.name}: {details}")
        self.method = method
        self.code = code
        self.details = details


class NotRegistered(KubeletError):
    """No plugin is registered (and connected) for the resource."""


class FeatureUnavailable(KubeletError):
    """This kubelet version or the plugin's options exclude the requested call."""


class BadPluginResponse(KubeletError):
    """The plugin answered, but not in a shape this kubelet can use."""
