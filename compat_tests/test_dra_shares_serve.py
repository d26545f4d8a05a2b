"""Shares of a device against the real ``serve --api dra`` (emulated 1.36 API server and
kubelet DRA manager, ``dra_bench``).

Until a device is published shared (``--dra-share``), every device is published whole, so an
allocation naming a ``shareID`` is one the driver never offered: the kubelet gets that
claim's clear error and the device stays free for a claim allocated whole. (The way through,
a device published shared and its shares prepared, is covered in-process by
``compat_tests/test_dra_shares.py`` and against the real ``serve`` by
``compat_tests/test_dra_shares_e2e.py``.)
"""

from __future__ import annotations

import uuid

import pytest

from compat_tests.apiserver import objects
from compat_tests.dra_bench import DRIVER, NAMESPACE, NODE, Bench
from compat_tests.kubelet.dra_results import ClaimRef


@pytest.fixture
def bench(dra_bench: Bench) -> Bench:
    """One node of emulated Kubernetes and a fake FPGA tree (compat_tests/conftest.py)."""
    return dra_bench


async def test_a_share_of_a_device_published_whole_is_refused_and_the_device_stays_free(bench):
    plugin = await bench.up()
    device = bench.device_names()[0]
    share = str(uuid.uuid4())
    bench.api.create_claim(NAMESPACE, "share")
    obj = bench.api.set_claim_status(NAMESPACE, "share", {"allocation": objects.allocation(
        [objects.result("req-0", DRIVER, NODE, device, shareID=share,
                        consumedCapacity={"contexts": "1"})], node_name=NODE)})
    claim = ClaimRef(NAMESPACE, "share", obj["metadata"]["uid"], (DRIVER,))

    outcome = await bench.dra.prepare([claim])
    assert not outcome.ok
    assert (f"claim {NAMESPACE}/share ({claim.uid}): share {share} of device {NODE}/{device} "
            in outcome.error), outcome.error
    assert "this driver publishes the device whole, not shared (a shareID the driver never " \
        "saw)" in outcome.error, plugin.text()[-2000:]

    whole = bench.claim("whole", [device])
    prepared = await bench.dra.prepare([whole])
    assert prepared.ok, prepared.error
