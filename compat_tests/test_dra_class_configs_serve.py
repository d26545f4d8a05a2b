"""Class configurations an old scheduler copied with no request names, through real ``serve``.

kube-scheduler before kubernetes#134793 copied each request's DeviceClass configuration
into the allocation with no ``requests`` (``Requests: nil, // All of them``). For a claim
with one request of an Intel class and one of an Alveo class, each class with its own
``FpgaFunction``, read literally both functions apply to both requests and the last one
wins for each. The driver applies each to the requests of the class it came from.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from compat_tests.apiserver import objects
from compat_tests.apiserver.allocate import allocate_claim
from compat_tests.dra_support import until
from compat_tests.fpga_images import NLB3_AFU_ID, XCLBIN_UUID
from compat_tests.kubelet.dra_results import ClaimRef
from compat_tests.test_dra_programming_serve import (
    ALVEO,
    DFL_PORT,
    DRIVER,
    NAMESPACE,
    NLB3,
    NODE,
    World,
    running,
)

ATTRIBUTES = f'device.attributes["{DRIVER}"]'


def function_class(name: str, selector: str, **fields: Any) -> dict[str, Any]:
    """A DeviceClass of this driver's devices ``selector`` matches, whose configuration
    loads ``fields``' function."""
    return objects.device_class(name, driver=DRIVER, spec={
        "selectors": [{"cel": {"expression": selector}}],
        "config": [{"opaque": {"driver": DRIVER, "parameters": {
            "apiVersion": f"{DRIVER}/v1alpha1", "kind": "FpgaFunction", **fields}}}]})


@pytest.fixture
async def world(tmp_path: Path, sockdir: Path, logdir: Path) -> AsyncIterator[World]:
    async for w in running(tmp_path, sockdir, logdir):
        yield w


@pytest.mark.parametrize("named", [False, True], ids=["old-scheduler", "current-scheduler"])
async def test_each_request_gets_its_own_classs_function(world: World, named: bool) -> None:
    world.api.create(function_class("nlb3", f'{ATTRIBUTES}.family == "intel" && '
                                    f'{ATTRIBUTES}.kernelDriver == "dfl"', afuID=NLB3_AFU_ID,
                                    image="intel/nlb3.gbs"))
    world.api.create(function_class("xclbin", f'{ATTRIBUTES}.family == "alveo"',
                                    xclbinUUID=XCLBIN_UUID, image="alveo/app.xclbin"))
    world.api.create_claim(NAMESPACE, "both", [("port", "nlb3"), ("card", "xclbin")])
    obj = allocate_claim(world.api, NAMESPACE, "both", NODE, class_config_requests=named)
    configs = obj["status"]["allocation"]["devices"]["config"]
    assert [c.get("requests") for c in configs] == ([["port"], ["card"]] if named
                                                    else [None, None])
    assert {r["request"]: r["device"] for r in obj["status"]["allocation"]["devices"][
        "results"]} == {"port": DFL_PORT, "card": ALVEO}
    obj = world.api.set_claim_status(NAMESPACE, "both", {
        **obj["status"], "reservedFor": [objects.pod_reference("both-pod", "both-pod-uid")]})
    result = await world.prepare(ClaimRef(NAMESPACE, "both", obj["metadata"]["uid"],
                                          (DRIVER,)))
    assert result.ok, result.error
    assert len(world.tools.invocations("fpgaconf")) == 1
    await until(lambda: world.published()[DFL_PORT]["afuID"] == NLB3, "the port's AFU ID")
    await until(lambda: world.published()[ALVEO].get("xclbinUUID") == XCLBIN_UUID,
                "the card's xclbin")
