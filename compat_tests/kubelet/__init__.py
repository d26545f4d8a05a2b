"""Emulated kubelets (k8s 1.8 .. 1.38) for testing the device plugin and DRA driver."""

from compat_tests.kubelet.dra import DraConfig, DraManager
from compat_tests.kubelet.dra_results import (
    ClaimCheckpoint,
    ClaimRef,
    ClaimResult,
    ClaimsOutcome,
    DeviceHealthRecord,
    DraRegistration,
    DriverCall,
    HealthAttempt,
    HealthUpdate,
    PreparedDevice,
    SliceWipe,
)
from compat_tests.kubelet.emulator import KubeletEmulator
from compat_tests.kubelet.models import MODELS
from compat_tests.kubelet.results import (
    ContainerAllocation,
    DeviceNode,
    EmulatedDevice,
    FeatureUnavailable,
    KubeletError,
    MountEntry,
    NotRegistered,
    PluginCallError,
    RegistrationRecord,
)

__all__ = [
    "MODELS",
    "ClaimCheckpoint",
    "ClaimRef",
    "ClaimResult",
    "ClaimsOutcome",
    "ContainerAllocation",
    "DeviceHealthRecord",
    "DeviceNode",
    "DraConfig",
    "DraManager",
    "DraRegistration",
    "DriverCall",
    "EmulatedDevice",
    "FeatureUnavailable",
    "HealthAttempt",
    "HealthUpdate",
    "KubeletEmulator",
    "KubeletError",
    "MountEntry",
    "NotRegistered",
    "PluginCallError",
    "PreparedDevice",
    "RegistrationRecord",
    "SliceWipe",
]
