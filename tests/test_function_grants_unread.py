"""The grant check at prepare fails closed on a device whose function cannot be read.

An AWS slot's AGFI is not in sysfs: only the SDK's describe tells it. When describe fails,
the slot may hold any AWS function, guarded ones included, so a namespace not granted every
class guarding an AWS function is refused; a slot that describe reads as holding nothing
still passes. The real :class:`Programmer` and :class:`FunctionGrants`, with a stand-in
loader (describe scripted) and a stand-in API (the catalogue, DeviceClasses, Namespaces).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from plugin.programming.guarded import CATALOGUE_LABELS, GrantsSource
from plugin.programming.loaders.base import LoadFailed, LoadJob
from plugin.programming.programmer import Programmer
from plugin.programming.quarantine import Quarantine
from plugin.serving.dra.function_grants import FunctionGrants, held_on
from value_types.claims import ClaimRef, PreparedDevice
from value_types.devices import Device, DeviceSet

DRIVER = "accelerator.b-com.com"
SLOT = "0000:00:1d.0"
AGFI = "agfi-0123456789abcdef0"
AWS_CLASS = "aws-app.accelerator.b-com.com"
ALVEO_CLASS = "alveo-app.accelerator.b-com.com"
GRANT = "functions.accelerator.b-com.com/"


def device_class(name: str, **function: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"config": [{"opaque": {
        "driver": DRIVER, "parameters": {"apiVersion": f"{DRIVER}/v1alpha1",
                                         "kind": "FpgaFunction", **function}}}]}}


class Api:
    """The reads FunctionGrants makes: one catalogue, its classes, labelled Namespaces."""

    def __init__(self, guarded: list[str], namespaces: dict[str, dict[str, str]]) -> None:
        self.guarded = guarded
        self.namespaces = namespaces

    async def config_maps(self, namespace: str,
                          labels: dict[str, str]) -> list[dict[str, Any]]:
        assert labels == CATALOGUE_LABELS
        return [{"metadata": {"name": "grants"}, "data": dict.fromkeys(self.guarded, "")}]

    async def get_namespace(self, name: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "labels": self.namespaces[name]}}

    async def device_classes(self) -> list[dict[str, Any]]:
        return [device_class(AWS_CLASS, agfiID=AGFI),
                device_class(ALVEO_CLASS, xclbinUUID="5c4ed2a35c524d6e9d167a8d8b2bc7e0",
                             image="alveo/app.xclbin")]


class Describe:
    """A stand-in AWS loader: describe reports ``holds`` (None: nothing), or fails."""

    name = "fpga-load-local-image"
    family = "aws"

    def __init__(self, holds: str | None = None, fails: str = "") -> None:
        self.holds, self.fails = holds, fails

    def unavailable(self, device: Device) -> str | None:
        return None

    async def load(self, job: LoadJob) -> None:
        raise AssertionError("the grant check never loads")

    async def loaded(self, device: Device) -> str | None:
        if self.fails:
            raise LoadFailed("describe", self.fails, touched=False)
        return self.holds


def grants(tmp_path: Path, loader: Describe, guarded: list[str]) -> FunctionGrants:
    devices = DeviceSet.of([Device(SLOT, "aws", attributes=(("slot", "0"),))])
    programmer = Programmer(enabled=True, loaders={"aws": loader}, checks=None,
                            quarantine=Quarantine(tmp_path / "state"),
                            devices=lambda: devices, rescan=lambda _why: None, driver=DRIVER)
    api = Api(guarded, {"team-a": {GRANT + AWS_CLASS: "true"}, "team-b": {}})
    return FunctionGrants(DRIVER, GrantsSource("kube-system"), lambda: api,
                          held_on(lambda: devices, programmer))


async def refused(found: FunctionGrants, namespace: str) -> list[str]:
    slot = PreparedDevice("pool", "slot-0", SLOT, ("fpga",), ())
    return [why for _, _, why in await found.refusals(ClaimRef(namespace, "c", "u"),
                                                      [slot], {})]


async def test_a_slot_whose_describe_fails_is_refused_while_an_aws_function_is_guarded(
        tmp_path: Path) -> None:
    found = grants(tmp_path, Describe(fails="fpga-describe-local-image: exit status 3"),
                   [AWS_CLASS])
    [why] = await refused(found, "team-b")
    assert "the function it holds cannot be read" in why
    assert "exit status 3" in why and AWS_CLASS in why and "team-b is not granted" in why
    # A namespace granted every class guarding an AWS function loses nothing it could reach.
    assert await refused(found, "team-a") == []


@pytest.mark.parametrize(("loader", "guarded"), [
    (Describe(holds=None), [AWS_CLASS]),  # read: it holds nothing
    (Describe(holds="agfi-0fedcba9876543210"), [AWS_CLASS]),  # read: an unguarded AGFI
    (Describe(fails="exit status 3"), [ALVEO_CLASS]),  # no AWS function is guarded
])
async def test_a_slot_that_holds_nothing_guarded_or_whose_family_is_unguarded_passes(
        tmp_path: Path, loader: Describe, guarded: list[str]) -> None:
    assert await refused(grants(tmp_path, loader, guarded), "team-b") == []


async def test_a_slot_read_holding_a_guarded_agfi_is_refused_as_before(tmp_path: Path) -> None:
    [why] = await refused(grants(tmp_path, Describe(holds=AGFI), [AWS_CLASS]), "team-b")
    assert AGFI in why and "cannot be read" not in why


# -- what is published: functionGuarded on a slot -----------------------------------------


class Counting(Describe):
    """:class:`Describe` that counts its calls."""

    def __init__(self, holds: str | None = None, fails: str = "") -> None:
        super().__init__(holds, fails)
        self.calls = 0

    async def loaded(self, device: Device) -> str | None:
        self.calls += 1
        return await super().loaded(device)


SLOT_DEVICE = Device(SLOT, "aws", attributes=(("slot", "0"),))


async def published_after_describes(found: FunctionGrants, turns: int = 1,
                                    interval: float = 3600.0) -> bool:
    """What the publisher is told of the slot after ``turns`` rounds of describes (the
    first one asked for by the publisher itself)."""
    await found.catalogue()
    found.publishes_guarded(SLOT_DEVICE)
    changed = asyncio.Event()
    found.on_changed = changed.set
    running = asyncio.create_task(found.slots.run(interval))
    try:
        for _ in range(turns):
            await asyncio.wait_for(changed.wait(), 30)
            changed.clear()
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    return found.publishes_guarded(SLOT_DEVICE)


@pytest.mark.parametrize(("loader", "published"), [
    (Describe(holds=AGFI), True),  # read: the guarded AGFI
    (Describe(holds=None), False),  # read: nothing
    (Describe(holds="agfi-0fedcba9876543210"), False),  # read: an unguarded AGFI
    (Describe(fails="exit status 3"), True),  # unread: it may hold the guarded one
])
async def test_a_slot_is_published_guarded_by_what_describe_reads(
        tmp_path: Path, loader: Describe, published: bool) -> None:
    found = grants(tmp_path, loader, [AWS_CLASS])
    await found.catalogue()
    assert found.publishes_guarded(SLOT_DEVICE) is True  # not described yet: fail closed
    assert await published_after_describes(found) is published


async def test_no_slot_is_described_while_no_aws_function_is_guarded(tmp_path: Path) -> None:
    loader = Counting(holds=AGFI)
    found = grants(tmp_path, loader, [ALVEO_CLASS])
    await found.catalogue()
    assert found.publishes_guarded(SLOT_DEVICE) is False
    running = asyncio.create_task(found.slots.run(0.05))
    await asyncio.sleep(0.3)
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
    assert loader.calls == 0


async def test_a_change_made_outside_the_driver_is_read_at_the_next_interval(
        tmp_path: Path) -> None:
    loader = Counting(holds=None)
    found = grants(tmp_path, loader, [AWS_CLASS])
    await found.catalogue()
    found.publishes_guarded(SLOT_DEVICE)
    changed = asyncio.Event()
    found.on_changed = changed.set
    running = asyncio.create_task(found.slots.run(0.05))
    try:
        await asyncio.wait_for(changed.wait(), 30)
        changed.clear()
        assert found.publishes_guarded(SLOT_DEVICE) is False
        loader.holds = AGFI  # loaded by hand with the SDK
        await asyncio.wait_for(changed.wait(), 30)
        assert found.publishes_guarded(SLOT_DEVICE) is True
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


async def test_a_describe_that_raises_is_taken_as_unread(tmp_path: Path) -> None:
    """A bug in the describe path keeps the loop going and the slot guarded."""

    class Breaking(Describe):
        broken = False

        async def loaded(self, device: Device) -> str | None:
            if self.broken:
                raise RuntimeError("a bug")
            return None

    loader = Breaking()
    found = grants(tmp_path, loader, [AWS_CLASS])
    assert await published_after_describes(found) is False  # read: it holds nothing
    loader.broken = True
    found.slots.stale()  # a load ended
    assert await published_after_describes(found) is True


async def test_a_slot_left_undescribed_while_unguarded_is_not_trusted_when_guarded_again(
        tmp_path: Path) -> None:
    """While no AWS function is guarded, a slot is not described, and what was read of it
    before is forgotten: once an AWS function is guarded again it is guarded until read."""
    loader = Counting(holds=None)
    found = grants(tmp_path, loader, [AWS_CLASS])
    api = found._api()
    assert await published_after_describes(found) is False  # read: nothing
    api.guarded[:] = [ALVEO_CLASS]  # the AWS class leaves the catalogue
    await found.refresh()
    found.slots.stale()  # a load ended, not described: nothing of its family is guarded
    running = asyncio.create_task(found.slots.run(3600))
    await asyncio.sleep(0.1)
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
    assert loader.calls == 1
    loader.holds = AGFI  # loaded meanwhile
    api.guarded[:] = [AWS_CLASS]
    await found.refresh()
    assert found.publishes_guarded(SLOT_DEVICE) is True  # not trusted: guarded until read
    assert await published_after_describes(found) is True
