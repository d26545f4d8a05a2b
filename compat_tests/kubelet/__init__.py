"""Emulated kubelets (k8s 1.8 .. 1.37) for testing the device plugin and DRA driver."""

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
    "ContainerAllocation",
    "DeviceNode",
    "EmulatedDevice",
    "FeatureUnavailable",
    "KubeletEmulator",
    "KubeletError",
    "MountEntry",
    "NotRegistered",
    "PluginCallError",
    "RegistrationRecord",
]
