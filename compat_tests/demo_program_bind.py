"""``make demo DEMO=program``, last scene: a failed load moves the pod to another card.

The real daemon with ``--api dra --programming on --program-at bind`` on a node of two Intel
cards holding NLB3, the example class ``nlb0.accelerator.b-com.com``, and the emulated 1.36
scheduler's PreBind (:class:`~compat_tests.apiserver.scheduler.BindingScheduler`, polling
every :data:`POLL` s here where upstream polls every 5 s). The port-PR ioctl stand-in fails
the first card's load (EIO, as a PR the hardware refuses): the driver sets ``FunctionFailed``,
the card is quarantined and tainted, the scheduler fails PreBind, clears the allocation and
schedules the pod again on the other card, where the load works, ``FunctionReady`` lets the
pod bind and NodePrepareResources finds the function held.
"""

from __future__ import annotations

import asyncio
import errno
import os
import time
from pathlib import Path
from typing import Any

import yaml

from api_versions.retry import RetryPolicy
from compat_tests.apiserver import ApiServerEmulator
from compat_tests.apiserver.scheduler import BindingScheduler
from compat_tests.demo import _until, say, section, show_container
from compat_tests.dra_support import wiper
from compat_tests.fake_port_pr import FakePortPr
from compat_tests.fake_sysfs import FakeNode
from compat_tests.fpga_images import write_image
from compat_tests.kubelet import KubeletEmulator
from compat_tests.kubelet.dra import DraConfig
from compat_tests.kubelet.dra_results import ClaimRef
from plugin.cli.config import Settings
from plugin.discovery.backends import make_backend
from plugin.process.daemon import Daemon
from plugin.programming.loaders.intel_pr import PortPrIoctl
from plugin.serving.deviceplugin.timing import Timing

NODE = "fpga-node-2"
DRIVER = "accelerator.b-com.com"
POLL = 2.0
LOAD = 1.0


class FirstCardFails:
    """The port-PR stand-in, except that every load of the first card asked fails (EIO
    after :data:`LOAD` s, the port left as it was): a card whose PR the hardware refuses."""

    def __init__(self, inner: FakePortPr) -> None:
        self.inner = inner
        self.failing: str | None = None
        self.failed = 0

    def __call__(self, fd: int, request: int, arg: bytearray) -> int:
        node = Path(os.readlink(f"/proc/self/fd/{fd}")).name
        if self.failing in (None, node):
            self.failing = node
            self.failed += 1
            time.sleep(LOAD)
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return self.inner(fd, request, arg)


async def bind_scene(root: Path, gbs: bytes, class_file: Path, nlb3: str) -> None:
    """The scene: its own node, image library (holding ``gbs`` as nlb0.gbs), API server,
    kubelet and daemon, stopped at its end."""
    library = root / "bind-images"
    write_image(library, "nlb0.gbs", gbs)
    section("Loading before the pod binds (--program-at bind): the first card fails its load")
    node = FakeNode(root / "bind-node")
    node.add_dfl_card("0000:3b:00.0", numa_node=0, afu_id=nlb3)
    node.add_dfl_card("0000:d8:00.0", numa_node=1, afu_id=nlb3)
    async with ApiServerEmulator("1.36") as api:
        api.create_node(NODE)
        api.create_namespace("default")
        device_class = yaml.safe_load(class_file.read_text())
        api.create(device_class)
        registry = root / "bind-registry"
        registry.mkdir()
        kubelet = KubeletEmulator(root / "bind-device-plugins", "1.36",
                                  plugins_registry=registry, reconcile_period=0.1,
                                  dra=DraConfig(node_name=NODE, wipe_slices=wiper(api)))
        await kubelet.start()
        port_pr = FirstCardFails(FakePortPr(node, [gbs], delay=LOAD))
        settings = Settings(
            device_plugin_dir=root / "bind-device-plugins", backend="intel",
            sysfs_root=node.sysfs_root, dev_root=node.dev_root, api="dra", node_name=NODE,
            kubeconfig=api.write_kubeconfig(root / "bind-kubeconfig"),
            plugins_registry_dir=registry, dra_state_dir=root / "bind-state",
            cdi_spec_dir=root / "bind-cdi", programming="on", program_at="bind",
            image_library=library, health_interval=0.1,
            retry=RetryPolicy(attempts=3, max_backoff=0.2, register_timeout=5.0))
        daemon = Daemon(settings, make_backend("intel", node.config()),
                        timing=Timing(round_backoff_initial=0.2),
                        loaders={"intel": PortPrIoctl(node.dev_root, ioctl=port_pr)})
        serving = asyncio.create_task(daemon.run())
        try:
            await _story(api, kubelet, port_pr, root / "bind-cdi",
                         device_class["metadata"]["name"])
        finally:
            daemon.stop()
            code = await serving
            await kubelet.stop()
        say(f"  the plugin stopped, exit code {code}")


async def _story(api: ApiServerEmulator, kubelet: KubeletEmulator, port_pr: FirstCardFails,
                 cdi: Path, device_class: str) -> None:
    await _until(lambda: len(_devices(api)) == 2, timeout=15)
    assert kubelet.dra is not None
    await kubelet.dra.wait_until(lambda: kubelet.dra.endpoints(DRIVER), 15.0, "registered")
    for device in _devices(api):
        say(f"  {device['name']}: bindingConditions {device.get('bindingConditions')}, "
            f"bindingFailureConditions {device.get('bindingFailureConditions')}")
    say(f"  a pod's claim asks for class {device_class}; the scheduler polls every "
        f"{POLL:.0f} s here (upstream: 5 s)")
    api.create_claim("default", "moved", [("fpga", device_class)])
    outcome = await BindingScheduler(api, poll=POLL, binding_timeout=60.0).schedule(
        "default", "moved-pod", "moved", NODE)
    say("  kubectl get events (the pod's and the node's, in order):")
    for event in sorted(api.list("events", "default"), key=lambda e: e["eventTime"]):
        say(f"    {event['type']:<7} {event['reason']:<25} {event['regarding']['kind']:<4} "
            f"{event['note'][:160]}")
    say(f"  allocations tried: {' then '.join(outcome.devices)}; bound: {outcome.bound}")
    if not outcome.bound:
        raise RuntimeError(f"the pod never bound: {outcome.errors}")
    first, second = outcome.devices[0], outcome.devices[-1]
    say(f"  FunctionFailed on {first}, as PreBind read it: {outcome.errors[0]}")
    await _until(lambda: _taints(api, first), timeout=15)
    for taint in _taints(api, first):
        say(f"  {first} tainted: {taint['key']}={taint.get('value', '')}:{taint['effect']}")
    claim = api.get("resourceclaims", "moved", "default")
    assert claim is not None
    for entry in claim["status"].get("devices", []):
        for condition in entry.get("conditions", []):
            say(f"  claim status, {entry['device']}: {condition['type']}="
                f"{condition['status']} ({condition['reason']}): {condition['message']}")
    ref = ClaimRef("default", "moved", claim["metadata"]["uid"], (DRIVER,))
    loads = len(port_pr.inner.calls)
    outcome_prepare = await kubelet.dra.prepare([ref])
    result = outcome_prepare.result(ref.uid)
    if not result.ok:
        raise RuntimeError(f"prepare failed: {result.error}")
    ids = outcome_prepare.cdi_ids(ref.uid)
    say(f"  NodePrepareResources on {second} -> CDI devices {', '.join(ids)} "
        f"(loads at prepare: {len(port_pr.inner.calls) - loads}; before binding: "
        f"{port_pr.failed} failed, {loads} good)")
    show_container(cdi, ids)


def _devices(api: ApiServerEmulator) -> list[dict[str, Any]]:
    return [d for s in api.list("resourceslices") if s["spec"]["nodeName"] == NODE
            for d in s["spec"].get("devices", [])]


def _taints(api: ApiServerEmulator, device: str) -> list[dict[str, Any]]:
    return [t for d in _devices(api) if d["name"] == device for t in d.get("taints", [])]
