"""A shared device's capacity request policy as the emulated 1.36 API server checks it: the
policy the driver publishes passes, each broken one is refused with the server's message."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from compat_tests.apiserver import ApiServerEmulator, objects
from compat_tests.apiserver.errors import ApiError

NODE = "fpga-node-1"
DRIVER = "accelerator.b-com.com"
Obj = dict[str, Any]


def slice_with(policy: Obj | None, value: str = "4", multi: bool = True) -> Obj:
    device = objects.device("fpga-0")
    device["capacity"] = {"contexts": {"value": value}}
    if policy is not None:
        device["capacity"]["contexts"]["requestPolicy"] = policy
    if multi:
        device["allowMultipleAllocations"] = True
    return objects.resource_slice("s", driver=DRIVER, node_name=NODE, devices=[device])


DRIVER_POLICY = {"default": "1", "validRange": {"min": "1", "max": "4", "step": "1"}}
PATH = "spec.devices[0].capacity[contexts].requestPolicy"


@pytest.mark.parametrize("policy", [
    DRIVER_POLICY,
    {"default": "2", "validValues": ["1", "2", "4"]},
    {"default": "2", "validRange": {"min": "2"}},
    {"default": "1"},
    None,
])
def test_valid_policies_are_stored_as_written(policy):
    api = ApiServerEmulator("1.36")
    created = api.create(slice_with(copy.deepcopy(policy)))
    capacity = created["spec"]["devices"][0]["capacity"]["contexts"]
    assert capacity.get("requestPolicy") == policy


@pytest.mark.parametrize(("policy", "message"), [
    ({"default": "1", "validValues": ["1"], "validRange": {"min": "1"}},
     f'{PATH}: Forbidden: exactly one policy can be specified, cannot specify "validValues" '
     'and "validRange" at the same time'),
    ({"validValues": ["1", "2"]},
     f"{PATH}.default: Required value: required when validValues is defined"),
    ({"validRange": {"min": "1"}},
     f"{PATH}.default: Required value: required when validRange is defined"),
    ({"default": "1", "validValues": ["2", "1"]},
     f'{PATH}.validValues[1]: Invalid value: "1": values must be sorted in ascending order'),
    ({"default": "1", "validValues": ["1", "8"]},
     f'{PATH}.validValues[1]: Invalid value: "8": option is larger than capacity value: 4'),
    ({"default": "3", "validValues": ["1", "2"]},
     f'{PATH}.validValues: Invalid value: "3": default value is not valid according to the '
     'requestPolicy'),
    ({"default": "1", "validValues": ["1", "1"]},
     f'{PATH}.validValues[1]: Duplicate value: "1"'),
    ({"default": "1", "validValues": [str(v) for v in range(1, 12)]},
     f"{PATH}.validValues: Too many: 11: must have at most 10 items"),
    ({"default": "1", "validRange": {"max": "4"}},
     f"{PATH}.validRange.min: Required value: required when validRange is defined"),
    ({"default": "5", "validRange": {"min": "5"}},
     f'{PATH}.validRange.min: Invalid value: "5": min is larger than capacity value: 4'),
    ({"default": "1", "validRange": {"min": "2"}},
     f'{PATH}.validRange.default: Invalid value: "1": default is less than min: 2'),
    ({"default": "1", "validRange": {"min": "1", "max": "5"}},
     f'{PATH}.validRange.max: Invalid value: "5": max is larger than capacity value: 4'),
    ({"default": "3", "validRange": {"min": "3", "max": "2"}},
     f'{PATH}.validRange.max: Invalid value: "3": min is larger than max: 2'),
    ({"default": "4", "validRange": {"min": "1", "max": "3"}},
     f'{PATH}.validRange.default: Invalid value: "4": default is more than max: 3'),
    ({"default": "1", "validRange": {"min": "1", "step": "0"}},
     f'{PATH}.validRange.step: Invalid value: "0": must be greater than zero'),
    ({"default": "1", "validRange": {"min": "1", "step": "4"}},
     f'{PATH}.validRange.step: Invalid value: "4": one step 5 is larger than capacity '
     'value: 4'),
    ({"default": "2", "validRange": {"min": "1", "step": "2"}},
     f'{PATH}.validRange.step: Invalid value: "2": value is not a multiple of a given step '
     '(2) from (1)'),
    ({"default": "1", "validRange": {"min": "1", "max": "4", "step": "2"}},
     f'{PATH}.validRange.step: Invalid value: "4": value is not a multiple of a given step '
     '(2) from (1)'),
])
def test_broken_policies_are_refused_with_the_servers_message(policy, message):
    api = ApiServerEmulator("1.36")
    with pytest.raises(ApiError) as refused:
        api.create(slice_with(policy))
    assert message in str(refused.value)
    assert api.list("resourceslices") == []


def test_a_policy_without_allow_multiple_allocations_is_forbidden():
    api = ApiServerEmulator("1.36")
    with pytest.raises(ApiError, match="allowMultipleAllocations must be true"):
        api.create(slice_with(DRIVER_POLICY, multi=False))

