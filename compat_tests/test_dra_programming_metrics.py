"""The programming metrics as a Prometheus scraper reads them off a real ``serve``.

The alerts (``AcceleratorDeviceLoadFailed``, ``AcceleratorFunctionLoadsFailing`` in
``deploy/components/monitoring/prometheusrule.yaml``) and the ``promtool`` unit tests of
tests/deploy assume series by these names and labels: ``dra_programming_total{driver,
family,loader,result}``, a ``dra_programming_seconds`` histogram of successful loads and the
``devices_load_failed`` gauge. This checks the process really writes them, on ``/metrics``,
for each outcome a claim can have: loaded, skipped (held already), refused, failed.

The world (emulated 1.36 API server and kubelet, a fake node of every family, stand-in vendor
tools) is :func:`compat_tests.test_dra_programming_serve.running`, with ``--metrics-port``
added; the scraper is :class:`compat_tests.test_dra_auto.Scraper`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from compat_tests.fake_sysfs import DEFAULT_AFU_ID
from compat_tests.fpga_images import NLB3_AFU_ID
from compat_tests.test_dra_auto import Scraper, key
from compat_tests.test_dra_programming_serve import DFL_PORT, World, function, running

NLB3 = function(afuID=NLB3_AFU_ID, image="intel/nlb3.gbs")
INTEL = "family=intel"


def metrics_flags() -> tuple[str, ...]:
    return ("--metrics-port", str(Scraper.free_port()), "--metrics-address", "127.0.0.1")


@pytest.fixture
async def world(tmp_path: Path, sockdir: Path, logdir: Path) -> AsyncIterator[World]:
    async for w in running(tmp_path, sockdir, logdir, *metrics_flags()):
        yield w


@pytest.fixture
async def failing(tmp_path: Path, sockdir: Path, logdir: Path) -> AsyncIterator[World]:
    """Tools whose every load fails at the hardware step (after touching the card)."""
    async for w in running(tmp_path, sockdir, logdir, *metrics_flags(),
                           fail="PR failed: timeout"):
        yield w


def programming(scraped: dict, result: str, loader: str = "") -> float | None:
    return scraped.get(key(f"dra_programming_total__{INTEL},loader={loader},result={result}"))


async def test_a_load_a_fast_path_claim_and_a_refusal_are_counted_apart(world: World) -> None:
    metrics = await Scraper.of(world.plugin)
    before = metrics.samples()
    # Nothing is counted before a claim names a function; the gauge is there at 0, so
    # `devices_load_failed > 0` has a series to be false on.
    assert not [k for k in before if k[0].startswith(
        "accelerator_device_plugin_dra_programming")], before
    assert before.get(key("devices_load_failed")) == 0

    assert (await world.prepare(world.claim("nlb3", DFL_PORT, NLB3))).ok
    scraped = await metrics.until("the load counted", **{
        f"dra_programming_total__{INTEL},loader=fpgaconf,result=loaded": 1})
    timing = f"dra_programming_seconds_count__{INTEL},loader=fpgaconf"
    assert scraped.get(key(timing)) == 1, scraped
    took = scraped[key(f"dra_programming_seconds_sum__{INTEL},loader=fpgaconf")]
    assert took > 0, took  # a load past --program-timeout is killed, never "loaded"
    assert scraped.get(key(f"dra_programming_seconds_bucket__{INTEL},loader=fpgaconf,"
                           "le=+Inf")) == 1, scraped

    # The same function again: held already, nothing loaded, counted as skipped (no loader).
    assert (await world.prepare(world.claim("nlb3-again", DFL_PORT, NLB3))).ok
    scraped = await metrics.until("the fast path counted", **{
        f"dra_programming_total__{INTEL},loader=,result=skipped": 1})
    assert programming(scraped, "loaded", "fpgaconf") == 1
    assert scraped.get(key(timing)) == 1, "a skip is no load: no timing"

    # A configuration whose image does not hold the function it names: refused before any
    # tool runs, and no failure (nothing touched the card).
    wrong = function(afuID=DEFAULT_AFU_ID, image="intel/nlb3.gbs")
    result = await world.prepare(world.claim("wrong", DFL_PORT, wrong))
    assert "holds AFU ID f7df405c" in result.error
    scraped = await metrics.until("the refusal counted", **{
        f"dra_programming_total__{INTEL},loader=,result=refused": 1})
    assert programming(scraped, "failed", "fpgaconf") is None
    assert scraped.get(key("devices_load_failed")) == 0
    assert len(world.tools.invocations("fpgaconf")) == 1

    # A configuration that cannot be read at all (an unknown field) is refused too.
    typo = function(afuID=NLB3_AFU_ID, image="intel/nlb3.gbs", afuId=NLB3_AFU_ID)
    result = await world.prepare(world.claim("typo", DFL_PORT, typo))
    assert "unknown field 'afuId'" in result.error
    await metrics.until("the unreadable configuration counted", **{
        f"dra_programming_total__{INTEL},loader=,result=refused": 2})
    assert len(world.tools.invocations("fpgaconf")) == 1


async def test_a_failed_load_is_counted_and_its_device_stays_counted(failing: World) -> None:
    world = failing
    metrics = await Scraper.of(world.plugin)
    result = await world.prepare(world.claim("nlb3", DFL_PORT, NLB3))
    assert "PR failed: timeout" in result.error
    scraped = await metrics.until("the failure counted and the device left unknown", **{
        f"dra_programming_total__{INTEL},loader=fpgaconf,result=failed": 1,
        "devices_load_failed": 1})
    assert programming(scraped, "loaded", "fpgaconf") is None
    assert key(f"dra_programming_seconds_count__{INTEL},loader=fpgaconf") not in scraped, \
        "only successful loads are timed"
    # The same device is Unhealthy in the devices gauge too (AcceleratorDevicesUnhealthy).
    unhealthy = {dict(labels).get("resource"): value for (name, labels), value
                 in scraped.items() if name == "accelerator_device_plugin_devices"
                 and ("health", "Unhealthy") in labels}
    assert sum(unhealthy.values()) >= 1, unhealthy

    # The kubelet retrying the claim fails again: the counter the repeated-failure alert
    # reads goes on counting, the gauge stays at one device.
    again = await world.prepare(world.claim("nlb3-retry", DFL_PORT, NLB3))
    assert "PR failed: timeout" in again.error
    scraped = await metrics.until("the second failure counted", **{
        f"dra_programming_total__{INTEL},loader=fpgaconf,result=failed": 2,
        "devices_load_failed": 1})
    assert world.plugin.alive
