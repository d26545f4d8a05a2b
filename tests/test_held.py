"""plugin.model.held: what a listing and a checkpoint mean for this plugin's devices."""

from __future__ import annotations

from api_versions.podresources import ClaimDevice, ContainerDevices, Listing
from plugin.model.held import (
    DEVICE_PLUGIN,
    Held,
    held_out,
    held_through_device_plugin,
    held_through_dra,
)
from value_types.devices import Device, DeviceSet

LISTING = Listing(
    devices=(ContainerDevices("ns", "p", "c", "b-com.com/accelerator", ("a", "zz")),
             ContainerDevices("ns", "q", "c", "other.com/gpu", ("b",))),
    claims=(ClaimDevice("ns", "p", "c", "ns", "k", "drv", "node", "dev-b"),
            ClaimDevice("ns", "p", "c", "ns", "x", "other-driver", "node", "dev-a")))


def test_only_this_plugins_resources_and_devices():
    held = held_through_device_plugin(LISTING, {"b-com.com/accelerator"}, {"a", "b"})
    assert dict(held.devices) == {"a": ("pod ns/p container c",)}
    assert held.describe() == \
        "1 device(s) (a) held through the device plugin by pod ns/p container c"


def test_dra_holds_from_the_checkpoint_and_the_listing():
    held = held_through_dra([("ns", "old", ["a"])], LISTING, "drv", {"dev-b": "b", "dev-a": "a"})
    assert dict(held.devices) == {"a": ("claim ns/old",), "b": ("claim ns/k",)}
    assert dict(held_through_dra([], None, "drv", {}).devices) == {}


def test_held_devices_turn_unhealthy_with_who_holds_them():
    devices = DeviceSet.of([Device("a", "intel"), Device("b", "intel")])
    out = held_out(devices, Held("dra", {"a": ("claim ns/k",)}))
    assert not out.get("a").healthy and "claim ns/k" in out.get("a").health_reason
    assert out.get("b").healthy
    assert held_out(devices, Held(DEVICE_PLUGIN, {})) is devices


def test_a_long_list_is_cut():
    held = Held(DEVICE_PLUGIN, {str(i): (f"pod ns/p{i} container c",) for i in range(9)})
    assert "and 4 more" in held.describe()


def test_a_device_held_through_any_of_its_replicas_is_held():
    listing = Listing(devices=(
        ContainerDevices("ns", "p", "c", "b-com.com/accelerator", ("a::2",)),
        ContainerDevices("ns", "q", "c", "b-com.com/accelerator", ("a::0", "b::7")),
        ContainerDevices("ns", "r", "c", "b-com.com/accelerator", ("c::1", "a::01", "::3")),
    ), claims=())
    held = held_through_device_plugin(listing, {"b-com.com/accelerator"}, {"a", "b"})
    assert dict(held.devices) == {"a": ("pod ns/p container c", "pod ns/q container c"),
                                  "b": ("pod ns/q container c",)}
    assert held.describe().startswith("2 device(s) (a, b) held through the device plugin")


def test_a_device_whose_own_id_looks_like_a_replica_is_itself():
    listing = Listing(devices=(
        ContainerDevices("ns", "p", "c", "b-com.com/accelerator", ("a::1",)),), claims=())
    held = held_through_device_plugin(listing, {"b-com.com/accelerator"}, {"a", "a::1"})
    assert dict(held.devices) == {"a::1": ("pod ns/p container c",)}
