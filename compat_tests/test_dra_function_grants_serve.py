"""A guarded function reaches only granted namespaces, by every path: the real ``serve``.

``serve --function-grants kube-system/function-grants`` with the emulated 1.36 API server
(claims allocated by its scheduler, with real CEL; every object written validated against
the 1.36 schemas, Namespaces and ConfigMaps included) and kubelet. An Alveo card holds
``app.xclbin``, the function of the guarded class ``app.accelerator.b-com.com``; namespace
``team-a`` is granted it, ``team-b`` is not. The admission policy (tests/deploy) refuses what
names the class in team-b; these check the paths it cannot see: the plain class
``accelerator.b-com.com`` as shipped before (selecting every device), ``b-com.com/accelerator``
(KEP-5004), a share of the card (``--dra-share``), a whole card left holding the function, a
grant withdrawn after allocation, and a catalogue the driver cannot read. And that the plain
class as the chart and kustomize render it now (deploy/components/dra/cluster) steers
team-b's pods to a device holding nothing guarded.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from compat_tests.apiserver import ApiServerEmulator
from compat_tests.apiserver.allocate import (
    AllocationError,
    allocate_claim,
    extended_resource_claim,
)
from compat_tests.dra_support import until
from compat_tests.fake_alveo import load_xclbin
from compat_tests.fake_sysfs import FakeNode
from compat_tests.fpga_images import XCLBIN_UUID
from compat_tests.kubelet.dra_results import ClaimRef
from compat_tests.test_dra_programming_serve import DRIVER, NODE, World, running
from compat_tests.test_dra_share_serve import shared

REPO = Path(__file__).resolve().parent.parent
CARD = "pci-0000-af-00-1"
CARD_BDF = "0000:af:00.1"
APP = "app.accelerator.b-com.com"
GRANTED, NOT_GRANTED = "team-a", "team-b"
CATALOGUE = ("kube-system", "function-grants")
CATALOGUE_LABELS = {"app.kubernetes.io/name": "accelerator-device-plugin",
                    "app.kubernetes.io/component": "function-admission"}
GRANT = f"functions.accelerator.b-com.com/{APP}"
FLAGS = ("--function-grants", CATALOGUE[0], "--guarded-classes", APP,
         "--rescan-interval", "0.2")
LABEL_HINT = f"`kubectl label namespace {NOT_GRANTED} {GRANT}=true`"


def shipped_plain_class() -> dict[str, Any]:
    """The plain class as the kustomize dra component ships it (the chart renders the same:
    tests/deploy)."""
    path = REPO / "deploy" / "components" / "dra" / "cluster" / "deviceclass.yaml"
    obj: dict[str, Any] = yaml.safe_load(path.read_text())
    obj["metadata"].pop("labels", None)
    return obj


def app_class() -> dict[str, Any]:
    attributes = f'device.attributes["{DRIVER}"]'
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": APP},
            "spec": {"selectors": [{"cel": {"expression": e}} for e in (
                f'device.driver == "{DRIVER}"', f'{attributes}.family == "alveo"',
                f'{attributes}.programmable || ("xclbinUUID" in {attributes} && '
                f'{attributes}.xclbinUUID == "{XCLBIN_UUID}")')],
                     "config": [{"opaque": {"driver": DRIVER, "parameters": {
                         "apiVersion": f"{DRIVER}/v1alpha1", "kind": "FpgaFunction",
                         "xclbinUUID": XCLBIN_UUID, "image": "alveo/app.xclbin"}}}]}}


def cluster(plain: str) -> Any:
    """What the admin set up before serve starts: the tenants' Namespaces (team-a granted),
    the catalogue, the guarded class, the card holding its function, and the plain class
    ``plain``: ``shipped`` (as rendered now) or ``old`` (every device, extended resource
    b-com.com/accelerator, as rendered before)."""

    def make(api: ApiServerEmulator, node: FakeNode) -> None:
        api.delete("deviceclasses", DRIVER)
        api.create(shipped_plain_class() if plain == "shipped" else {
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": DRIVER},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}],
                     "extendedResourceName": "b-com.com/accelerator"}})
        for namespace in (GRANTED, NOT_GRANTED):
            api.create_namespace(namespace)
        api.core.label_namespace(GRANTED, GRANT, "true")
        api.core.label_namespace(NOT_GRANTED, GRANT, "yes")  # not "true": no grant
        api.core.put_config_map(*CATALOGUE, {APP: ""}, CATALOGUE_LABELS)
        api.core.put_config_map("kube-system", "unrelated", {"other.b-com.com": ""})
        api.create(app_class())
        load_xclbin(node, CARD_BDF, XCLBIN_UUID)

    return make


async def guarded_world(tmp_path: Path, sockdir: Path, logdir: Path, plain: str,
                        *flags: str) -> AsyncIterator[World]:
    async for world in running(tmp_path, sockdir, logdir, *FLAGS, *flags,
                               before=cluster(plain)):
        await until(lambda w=world: w.published()[CARD].get("functionGuarded") is True,
                    "the card published functionGuarded")
        yield world


@pytest.fixture
async def whole(tmp_path: Path, sockdir: Path, logdir: Path) -> AsyncIterator[World]:
    async for world in guarded_world(tmp_path, sockdir, logdir, "old"):
        yield world


@pytest.fixture
async def shares(tmp_path: Path, sockdir: Path, logdir: Path) -> AsyncIterator[World]:
    async for world in guarded_world(tmp_path, sockdir, logdir, "old", "--dra-share",
                                     "alveo=4"):
        await until(lambda w=world: shared(w, CARD) == 4, "the card published shared")
        yield world


@pytest.fixture
async def shipped(tmp_path: Path, sockdir: Path, logdir: Path) -> AsyncIterator[World]:
    async for world in guarded_world(tmp_path, sockdir, logdir, "shipped", "--dra-share",
                                     "alveo=4"):
        yield world


def on_card(world: World, namespace: str, name: str, device_class: str = DRIVER) -> ClaimRef:
    """A claim of ``device_class`` for the card (by its PCI address), allocated by the
    emulated scheduler."""
    created = world.api.create({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "fpga", "exactly": {
            "deviceClassName": device_class, "selectors": [{"cel": {"expression": (
                f'device.attributes["resource.kubernetes.io"].pciBusID == "{CARD_BDF}"')}}]}}]}}})
    allocate_claim(world.api, namespace, name, NODE)
    return ClaimRef(namespace, name, created["metadata"]["uid"], (DRIVER,))


def device_of(world: World, ref: ClaimRef) -> dict[str, Any]:
    claim = world.api.get("resourceclaims", ref.name, ref.namespace)
    [result] = claim["status"]["allocation"]["devices"]["results"]
    return dict(result)


async def error_of(world: World, ref: ClaimRef) -> str:
    result = await world.prepare(ref)
    assert not result.ok, "prepared"
    return str(result.error)


async def test_a_share_through_the_plain_class_is_refused_to_a_namespace_not_granted(
        shares: World) -> None:
    world = shares
    tenant = on_card(world, NOT_GRANTED, "plain-share")
    assert device_of(world, tenant)["shareID"], "the scheduler gave team-b a share"
    error = await error_of(world, tenant)
    assert f"holds xclbinUUID {XCLBIN_UUID}, an FPGA function guarded by DeviceClass " \
        f"{APP}, which namespace {NOT_GRANTED} is not granted" in error, error
    assert LABEL_HINT in error and "nothing was loaded" in error
    assert world.tools.invocations() == []
    # A granted namespace's share of the same card, through the same class, is prepared.
    assert (await world.prepare(on_card(world, GRANTED, "granted-share"))).ok
    # Said in the claim's status and an Event, as any refused function.
    await until(lambda: [e for e in world.api.list("events", NOT_GRANTED)
                         if e["reason"] == "FunctionNotGranted"], "a FunctionNotGranted Event")
    assert world.plugin.alive


async def test_a_whole_card_left_holding_the_function_is_refused_to_a_namespace_not_granted(
        whole: World) -> None:
    world = whole
    tenant = on_card(world, NOT_GRANTED, "plain-whole")
    assert "shareID" not in device_of(world, tenant)
    error = await error_of(world, tenant)
    assert f"an FPGA function guarded by DeviceClass {APP}" in error and LABEL_HINT in error
    world.api.delete("resourceclaims", "plain-whole", NOT_GRANTED)
    assert (await world.prepare(on_card(world, GRANTED, "granted-whole"))).ok
    assert world.tools.invocations() == []


async def test_the_extended_resource_of_the_old_plain_class_is_refused_on_the_card(
        whole: World) -> None:
    """A pod asking b-com.com/accelerator: 1 names no guarded class, so admission lets it
    through; the scheduler's claim for it lands on whatever device the old class selects.
    The devices are taken one claim at a time until one lands on the card."""
    world = whole
    for index in range(6):
        claim = extended_resource_claim(world.api, NOT_GRANTED, f"pod-{index}", "app",
                                        "b-com.com/accelerator", 1, node_name=NODE)
        [result] = claim["status"]["allocation"]["devices"]["results"]
        if result["device"] == CARD:
            break
    else:
        raise AssertionError("no claim landed on the card")
    ref = ClaimRef(NOT_GRANTED, claim["metadata"]["name"], claim["metadata"]["uid"], (DRIVER,))
    error = await error_of(world, ref)
    assert f"guarded by DeviceClass {APP}" in error and LABEL_HINT in error


async def test_the_shipped_plain_class_gives_team_b_only_devices_holding_nothing_guarded(
        shipped: World) -> None:
    world = shipped
    published = world.published()
    assert [name for name, d in published.items() if d.get("functionGuarded")] == [CARD]
    with pytest.raises(AllocationError, match="free, untainted and selected"):
        on_card(world, NOT_GRANTED, "plain-card")
    # b-com.com/accelerator through the shipped class: every claim lands elsewhere, and is
    # prepared; once the other devices are taken, the pod waits rather than get the card.
    taken = []
    with pytest.raises(AllocationError, match="free, untainted and selected"):
        for index in range(len(published)):
            claim = extended_resource_claim(world.api, NOT_GRANTED, f"pod-{index}", "app",
                                            "b-com.com/accelerator", 1, node_name=NODE)
            [result] = claim["status"]["allocation"]["devices"]["results"]
            taken.append(result["device"])
            ref = ClaimRef(NOT_GRANTED, claim["metadata"]["name"],
                           claim["metadata"]["uid"], (DRIVER,))
            assert (await world.prepare(ref)).ok
    assert CARD not in taken and len(taken) == len(published) - 1
    # The function's own class still reaches the card, for the granted namespace.
    assert (await world.prepare(on_card(world, GRANTED, "app-share", APP))).ok


async def test_a_grant_withdrawn_after_allocation_refuses_the_claim_at_prepare(
        whole: World) -> None:
    world = whole
    ref = on_card(world, GRANTED, "before-withdrawal", APP)  # admitted while granted
    world.api.core.label_namespace(GRANTED, GRANT, None)
    error = await error_of(world, ref)
    assert f"which namespace {GRANTED} is not granted" in error, error
    assert world.tools.invocations() == []
    world.api.core.label_namespace(GRANTED, GRANT, "true")

    for _ in range(100):  # the Namespace is read again within seconds
        if (await world.prepare(ref)).ok:
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("never prepared once granted again")


@pytest.mark.parametrize(("denied", "said"), [
    ("configmaps", "every class naming a function is taken as guarded while the catalogue "
                   "ConfigMaps of kube-system cannot be read"),
    ("deviceclasses", "which functions are guarded cannot be told (the DeviceClasses cannot "
                      "be read"),
    ("namespaces", f"whether namespace {NOT_GRANTED} is granted it cannot be told"),
])
async def test_what_cannot_be_read_fails_closed_for_a_device_holding_a_function(
        whole: World, denied: str, said: str) -> None:
    world = whole
    tenant = on_card(world, NOT_GRANTED, "plain")
    world.api.faults.deny("get" if denied == "namespaces" else "list", denied)
    for _ in range(100):  # what was read is used for up to two seconds
        error = await error_of(world, tenant)
        if said in error:
            break
        await asyncio.sleep(0.1)
    assert said in error, error
    assert world.tools.invocations() == []
    # A device holding nothing is no one's guarded function: prepared all the same.
    world.api.delete("resourceclaims", "plain", NOT_GRANTED)
    other = on_empty_card(world, NOT_GRANTED, "nothing")
    assert (await world.prepare(other)).ok


def on_empty_card(world: World, namespace: str, name: str) -> ClaimRef:
    """A claim of the plain class for the other Alveo card, which holds no xclbin."""
    created = world.api.create({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "fpga", "exactly": {
            "deviceClassName": DRIVER, "selectors": [{"cel": {"expression": (
                'device.attributes["resource.kubernetes.io"].pciBusID == "0000:17:00.1"')}}]}}]}}})
    allocate_claim(world.api, namespace, name, NODE)
    return ClaimRef(namespace, name, created["metadata"]["uid"], (DRIVER,))


async def test_the_rendered_copy_keeps_the_class_guarded_while_the_configmap_is_missing(
        whole: World) -> None:
    world = whole
    world.api.core.delete_config_map(*CATALOGUE)
    error = await error_of(world, on_card(world, NOT_GRANTED, "plain"))
    assert f"guarded by DeviceClass {APP}" in error, error
