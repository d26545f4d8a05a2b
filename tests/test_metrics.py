"""/metrics tells an operator which generation each resource uses and what Allocate did."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from api_versions.retry import RetryPolicy
from compat_tests.kubelet import KubeletEmulator, PluginCallError
from plugin.cli.config import Settings
from plugin.discovery.backends import make_backend
from plugin.discovery.backends.base import BackendConfig
from plugin.process import metrics
from plugin.process.daemon import Daemon

RESOURCE = "b-com.com/accelerator"


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[(f"accelerator_device_plugin_{name}", frozenset(labels.items()))]


async def test_metrics_follow_registration_devices_and_allocations() -> None:
    directory = Path(tempfile.mkdtemp(prefix="dpm", dir="/tmp"))
    port = metrics.enable("127.0.0.1", 0)
    settings = Settings(device_plugin_dir=directory, backend="units", accel_nbunits=3,
                        retry=RetryPolicy(attempts=3, max_backoff=0.1))
    daemon = Daemon(settings, make_backend("units", BackendConfig(nb_units=3)))
    task = asyncio.create_task(daemon.run())
    try:
        async with KubeletEmulator(directory, "1.9") as kubelet:
            await kubelet.wait_for_devices(RESOURCE, timeout=10)
            await kubelet.allocate(RESOURCE, ["0"])
            with contextlib.suppress(PluginCallError):
                await kubelet.allocate(RESOURCE, ["9"])
            samples = await asyncio.to_thread(scrape, port)
    finally:
        daemon.stop()
        await asyncio.wait_for(task, 10)
        shutil.rmtree(directory, ignore_errors=True)
    r = RESOURCE
    assert value(samples, "registered", resource=r, generation="v1alpha2") == 1
    assert value(samples, "registered", resource=r, generation="v1beta1") == 0
    assert value(samples, "registrations_total", resource=r, generation="v1alpha2") == 1
    assert value(samples, "devices", resource=r, health="Healthy") == 3
    assert value(samples, "node_api", api="device-plugin") == 1
    assert value(samples, "node_api", api="dra") == 0
    for result in ("granted", "refused"):
        assert value(samples, "allocations_total", resource=r, generation="v1alpha2",
                     result=result) == 1
