"""DeviceClasses as read for --api auto: which resource names they hand to DRA."""

from __future__ import annotations

from api_versions.device_classes import extended_resource_names


def test_only_classes_with_an_extended_resource_name_map_one():
    classes = [
        {"metadata": {"name": "fpga"}, "spec": {"extendedResourceName": "b-com.com/accelerator",
                                                "selectors": []}},
        {"metadata": {"name": "plain"}, "spec": {"selectors": []}},
        {"metadata": {"name": "dropped"}, "spec": {}},  # a server with the gate off
        {"metadata": {"name": "second"}, "spec": {"extendedResourceName":
                                                  "b-com.com/accelerator"}},
        {"metadata": {"name": "broken"}, "spec": "not a map"},
    ]
    assert extended_resource_names(classes) == {"b-com.com/accelerator": "fpga"}
