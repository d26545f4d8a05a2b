"""``serve --api dra --dra-share``: devices published for sharing, as the API server stores them.

The real process, the emulated 1.36 API server (which validates every slice it is sent against
the 1.36 schemas and rules, DRAConsumableCapacity on) and kubelet, and the fake node and
vendor-tool stand-ins of :mod:`compat_tests.test_dra_programming_serve`. What a scheduler
reads is the stored slice: ``allowMultipleAllocations`` and a ``contexts`` capacity on a
shared device, neither on a device allocated whole.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from compat_tests.apiserver import validate
from compat_tests.dra_support import until
from compat_tests.fake_alveo import DEFAULT_INTERFACE_UUID as ALVEO_INTERFACE
from compat_tests.fake_alveo import load_xclbin
from compat_tests.fake_sysfs import DEFAULT_INTERFACE_ID
from compat_tests.fpga_images import (
    NLB3_AFU_ID,
    XCLBIN_UUID,
    XclbinSpec,
    build_gbs,
    build_xclbin,
    with_compute_units,
    write_image,
)
from compat_tests.test_dra_programming_serve import (
    ALVEO,
    DFL_PORT,
    NLB3,
    NODE,
    World,
    function,
    running,
)
from plugin.programming.ids import dashed

OTHER_ALVEO = "pci-0000-af-00-1"
OPAE_PORT = "pci-0000-5e-00-0"
GBS = "intel/nlb3x5.gbs"
OTHER_ALVEO_BDF = "0000:af:00.1"
IMAGE = "alveo/cu3.xclbin"


def device(world: World, name: str) -> dict[str, Any]:
    """The stored slice entry of device ``name``; each stored slice is also what the 1.36
    schemas and rules accept."""
    for obj in world.api.list("resourceslices"):
        if obj["spec"]["nodeName"] != NODE:
            continue
        for entry in obj["spec"].get("devices", []):
            if entry["name"] == name:
                return entry
    raise AssertionError(f"device {name} is not published")


def shared(world: World, name: str) -> int:
    """The contexts ``name`` is published shared with; 0: published whole."""
    entry = device(world, name)
    if not entry.get("allowMultipleAllocations"):
        assert "contexts" not in entry.get("capacity", {}), entry
        return 0
    capacity = entry["capacity"]["contexts"]
    total = int(capacity["value"])
    assert capacity["requestPolicy"] == {"default": "1", "validRange": {
        "min": "1", "max": str(total), "step": "1"}}
    return total


def slices_valid(world: World) -> bool:
    stored = [o for o in world.api.list("resourceslices") if o["spec"]["nodeName"] == NODE]
    return all(validate({k: v for k, v in o.items() if k != "status"}, model="1.36") == []
               for o in stored)


@pytest.fixture
async def by_image(tmp_path: Path, sockdir: Path, logdir: Path) -> AsyncIterator[World]:
    async for world in running(tmp_path, sockdir, logdir, "--dra-share", "alveo=image"):
        write_image(world.library, IMAGE, build_xclbin(with_compute_units(3, XclbinSpec(
            interface_uuid=dashed(ALVEO_INTERFACE)))))
        yield world


@pytest.fixture
async def ports_by_image(tmp_path: Path, sockdir: Path, logdir: Path) -> AsyncIterator[World]:
    async for world in running(tmp_path, sockdir, logdir, "--dra-share", "intel=image"):
        write_image(world.library, GBS, build_gbs(
            afu_ids=(NLB3_AFU_ID,), interface_id=dashed(DEFAULT_INTERFACE_ID), contexts=5))
        yield world


@pytest.fixture
async def four(tmp_path: Path, sockdir: Path, logdir: Path) -> AsyncIterator[World]:
    async for world in running(tmp_path, sockdir, logdir, "--dra-share", "alveo=4",
                               "--rescan-interval", "0.2"):
        yield world


async def test_a_card_holding_what_the_driver_loaded_is_shared_as_its_image_says(
        by_image: World) -> None:
    world = by_image
    # Holding nothing: published whole, as every other device.
    assert shared(world, ALVEO) == 0
    assert "xclbinUUID" not in device(world, ALVEO)["attributes"]
    ref = world.claim("loads", ALVEO, function(xclbinUUID=XCLBIN_UUID, image=IMAGE))
    result = await world.prepare(ref)
    assert result.ok, result.error
    await until(lambda: device(world, ALVEO)["attributes"].get("xclbinUUID") ==
                {"string": XCLBIN_UUID}, "the loaded xclbin published")
    # The claim that loaded it holds it whole: still published whole.
    assert shared(world, ALVEO) == 0
    assert world.kubelet.dra is not None
    assert (await world.kubelet.dra.unprepare([ref])).ok
    # Gone without a clear: the card holds the xclbin, whose IP layout has 3 compute units.
    await until(lambda: shared(world, ALVEO) == 3, "the card published shared with 3 contexts")
    assert device(world, ALVEO)["attributes"]["xclbinUUID"] == {"string": XCLBIN_UUID}
    assert shared(world, OTHER_ALVEO) == 0
    assert slices_valid(world)
    assert world.plugin.alive


async def test_a_port_the_driver_loaded_is_shared_as_its_gbs_says(
        ports_by_image: World) -> None:
    world = ports_by_image
    # Both ports hold an AFU, but not one this driver loaded: its image is unknown.
    assert shared(world, DFL_PORT) == 0 and shared(world, OPAE_PORT) == 0
    ref = world.claim("loads", DFL_PORT, function(afuID=NLB3_AFU_ID, image=GBS))
    result = await world.prepare(ref)
    assert result.ok, result.error
    await until(lambda: device(world, DFL_PORT)["attributes"]["afuID"] == {"string": NLB3},
                "the loaded AFU published")
    assert shared(world, DFL_PORT) == 0
    assert world.kubelet.dra is not None
    assert (await world.kubelet.dra.unprepare([ref])).ok
    await until(lambda: shared(world, DFL_PORT) == 5, "the port published shared with 5")
    assert shared(world, OPAE_PORT) == 0
    assert slices_valid(world)


async def test_a_number_shares_every_card_holding_an_xclbin_unless_a_claim_holds_it(
        four: World) -> None:
    world = four
    assert shared(world, ALVEO) == 0 and shared(world, OTHER_ALVEO) == 0
    # Loaded by other means (an admin's xbutil, seen at the next rescan): with a number,
    # no image is needed.
    load_xclbin(world.node, OTHER_ALVEO_BDF, XCLBIN_UUID)
    await until(lambda: shared(world, OTHER_ALVEO) == 4, "published shared with 4 contexts")
    assert shared(world, ALVEO) == 0  # holds nothing
    assert slices_valid(world)
    # A claim allocated whole before (its result has no share) holds it whole.
    whole = world.claim("whole", OTHER_ALVEO)
    assert (await world.prepare(whole)).ok
    await until(lambda: shared(world, OTHER_ALVEO) == 0, "published whole under the claim")
    assert world.kubelet.dra is not None
    assert (await world.kubelet.dra.unprepare([whole])).ok
    await until(lambda: shared(world, OTHER_ALVEO) == 4, "shared again once it is gone")
    assert world.plugin.alive


async def test_a_card_held_whole_at_start_is_published_whole(four: World) -> None:
    """The record is read before the first slice: a claim prepared before a restart holds
    its card whole from the first publication of the new process on."""
    world = four
    load_xclbin(world.node, OTHER_ALVEO_BDF, XCLBIN_UUID)
    whole = world.claim("whole", OTHER_ALVEO)
    assert (await world.prepare(whole)).ok
    await until(lambda: shared(world, OTHER_ALVEO) == 0, "published whole under the claim")
    assert world.kubelet.dra is not None
    world.plugin.kill()
    before = {o["metadata"]["name"] for o in world.api.list("resourceslices")}
    for name in before:
        world.api.delete("resourceslices", name)
    world.plugin = world.restart("plugin-again")
    await until(lambda: any(o["spec"]["nodeName"] == NODE
                            for o in world.api.list("resourceslices")), "published again")
    await until(lambda: "xclbinUUID" in device(world, OTHER_ALVEO)["attributes"], "scanned")
    assert shared(world, OTHER_ALVEO) == 0
    # The kubelet calls again until the new process answers, as a real one does.
    for _ in range(100):
        if (await world.kubelet.dra.unprepare([whole])).ok:
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the restarted driver never unprepared the claim")
    await until(lambda: shared(world, OTHER_ALVEO) == 4, "shared once the claim is gone")
    assert world.plugin.alive


def test_a_family_that_cannot_be_shared_stops_serve_at_start(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "plugin", "serve", "--api", "dra", "--node-name", NODE,
         "--backend", "units", "--dra-state-dir", str(tmp_path / "state"),
         "--dra-share", "alveo=image,aws=2"],
        capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, timeout=60)
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert line == ("accelerator-device-plugin serve: error: argument --dra-share: aws "
                    "devices cannot be shared: only intel and alveo can (an Intel port's AFU "
                    "opened shared, an Alveo card's xclbin used by several XRT processes); "
                    "remove aws=2")
    assert not (tmp_path / "state").exists()
