"""An AWS slot holding a guarded AGFI is published ``functionGuarded``: the real ``serve``.

An AWS slot's AGFI is not in sysfs; only the SDK's describe tells it. With a guarded class
naming an AWS function, ``serve --function-grants`` describes each slot (the stand-in
``fpga-describe-local-image`` reads the slots' state file), and publishes the slot holding
the guarded AGFI guarded, so the plain class as the chart and kustomize render it steers
team-b's pods to the other slot instead of them being refused at prepare. A load of the
guarded AGFI onto the other slot, for the granted team-a, makes that slot guarded too.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from compat_tests.apiserver import ApiServerEmulator
from compat_tests.apiserver.allocate import AllocationError, allocate_claim
from compat_tests.dra_support import until
from compat_tests.fake_sysfs import FakeNode
from compat_tests.kubelet.dra_results import ClaimRef
from compat_tests.test_dra_function_grants_serve import (
    CATALOGUE,
    CATALOGUE_LABELS,
    GRANTED,
    NOT_GRANTED,
    shipped_plain_class,
)
from compat_tests.test_dra_programming_serve import DRIVER, NODE, World, running

GUARDED_AGFI = "agfi-0123456789abcdef0"
AWS_CLASS = "aws-app.accelerator.b-com.com"
GRANT = f"functions.accelerator.b-com.com/{AWS_CLASS}"
FLAGS = ("--function-grants", CATALOGUE[0], "--guarded-classes", AWS_CLASS,
         "--rescan-interval", "0.2")


def aws_class() -> dict[str, Any]:
    attributes = f'device.attributes["{DRIVER}"]'
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": AWS_CLASS},
            "spec": {"selectors": [{"cel": {"expression": e}} for e in (
                f'device.driver == "{DRIVER}"', f'{attributes}.family == "aws"')],
                     "config": [{"opaque": {"driver": DRIVER, "parameters": {
                         "apiVersion": f"{DRIVER}/v1alpha1", "kind": "FpgaFunction",
                         "agfiID": GUARDED_AGFI}}}]}}


def cluster(state: Path) -> Any:
    """Namespaces (team-a granted the AWS class), the catalogue guarding it, the shipped
    plain class, and SDK slot 0 holding the guarded AGFI."""

    def make(api: ApiServerEmulator, _node: FakeNode) -> None:
        api.delete("deviceclasses", DRIVER)
        api.create(shipped_plain_class())
        for namespace in (GRANTED, NOT_GRANTED):
            api.create_namespace(namespace)
        api.core.label_namespace(GRANTED, GRANT, "true")
        api.core.put_config_map(*CATALOGUE, {AWS_CLASS: ""}, CATALOGUE_LABELS)
        api.create(aws_class())
        state.write_text(json.dumps({"0": {"agfi": GUARDED_AGFI, "status": "loaded"}}))

    return make


def address_of_sdk_slot(world: World, slot: int) -> str:
    """The PCI address of SDK slot ``slot``'s application function, as describe shows it."""
    shown = subprocess.run([str(world.tools.describe), "-S", str(slot)], check=True,
                           capture_output=True, text=True).stdout.split()
    return next(word for word in shown if word.count(":") == 2)


def name_of(address: str) -> str:
    return "pci-" + address.replace(":", "-").replace(".", "-")


def aws_devices(world: World) -> dict[str, dict[str, Any]]:
    return {name: d for name, d in world.published().items() if d.get("family") == "aws"}


@pytest.fixture
async def slots(tmp_path: Path, sockdir: Path, logdir: Path) -> AsyncIterator[World]:
    async for world in running(tmp_path, sockdir, logdir, *FLAGS,
                               before=cluster(tmp_path / "tools" / "aws-slots.json")):
        yield world


def claim_of(world: World, namespace: str, name: str, device_class: str,
             address: str | None = None) -> ClaimRef:
    """A claim of ``device_class`` for an AWS slot (the one at ``address``, if given),
    allocated by the emulated scheduler."""
    selectors = [{"cel": {"expression": f'device.attributes["{DRIVER}"].family == "aws"'}}]
    if address is not None:
        selectors.append({"cel": {"expression": (
            f'device.attributes["resource.kubernetes.io"].pciBusID == "{address}"')}})
    created = world.api.create({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "fpga", "exactly": {
            "deviceClassName": device_class, "selectors": selectors}}]}}})
    allocate_claim(world.api, namespace, name, NODE)
    return ClaimRef(namespace, name, created["metadata"]["uid"], (DRIVER,))


async def test_the_slot_holding_the_guarded_agfi_is_published_guarded_and_avoided(
        slots: World) -> None:
    world = slots
    at_guarded, at_other = address_of_sdk_slot(world, 0), address_of_sdk_slot(world, 1)
    guarded, other = name_of(at_guarded), name_of(at_other)
    assert set(aws_devices(world)) == {guarded, other}
    await until(lambda: [n for n, d in aws_devices(world).items()
                         if d.get("functionGuarded")] == [guarded],
                "only the slot holding the guarded AGFI published guarded")
    # team-b on the plain class: never the guarded slot, and the other one is prepared.
    with pytest.raises(AllocationError, match="free, untainted and selected"):
        claim_of(world, NOT_GRANTED, "plain-guarded", DRIVER, at_guarded)
    tenant = claim_of(world, NOT_GRANTED, "plain-aws", DRIVER)
    claim = world.api.get("resourceclaims", "plain-aws", NOT_GRANTED)
    assert claim["status"]["allocation"]["devices"]["results"][0]["device"] == other
    result = await world.prepare(tenant)
    assert result.ok, result.error
    world.api.delete("resourceclaims", "plain-aws", NOT_GRANTED)
    assert (await world.kubelet.dra.unprepare([tenant])).result(tenant.uid).ok  # type: ignore[union-attr]
    # team-a loads the guarded AGFI onto the other slot: it is published guarded in turn.
    loaded = claim_of(world, GRANTED, "aws-app", AWS_CLASS, at_other)
    result = await world.prepare(loaded)
    assert result.ok, result.error
    assert world.tools.invocations(
        "fpga-load-local-image")[-1][:4] == ["-S", "1", "-I", GUARDED_AGFI]
    await until(lambda: aws_devices(world)[other].get("functionGuarded") is True,
                "the slot loaded with the guarded AGFI published guarded")
    assert world.plugin.alive
