"""``make demo DEMO=migrate``: one node moved to DRA and back, live.

A simulated node (fake Intel FPGA sysfs), an emulated 1.36 API server holding a DeviceClass
that maps ``b-com.com/accelerator`` (KEP-5004), emulated kubelets, and the real daemon with
``--api auto``. The node's kubelet is 1.33 (no DRA): the same pod request, one
``b-com.com/accelerator``, is served by the device plugin. The kubelet is upgraded to 1.36
under the running plugin: the node is served through DRA, the request arrives as a claim, and
the container gets the same variables through CDI. Downgraded back to 1.33, the device plugin
serves it again. Nothing is restarted but the kubelet.

Containers outlive a kubelet upgrade: the pod that got a port through the device plugin keeps
running on 1.36, the kubelet's PodResources API lists it, and that port is published tainted
(``<driver>/in-use``) until the pod ends, then offered within a second. The way back is the
same: a claim still prepared keeps its port Unhealthy to the 1.33 device plugin until released.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from api_versions.retry import RetryPolicy
from compat_tests.apiserver import ApiServerEmulator
from compat_tests.demo import RESOURCE, _until, say, section, show_container, told_in
from compat_tests.fake_sysfs import build_intel_node
from compat_tests.kubelet import KubeletEmulator
from compat_tests.kubelet.dra import DraConfig
from compat_tests.kubelet.dra_results import ClaimRef
from plugin.cli.config import Settings
from plugin.discovery.backends import make_backend
from plugin.process.daemon import Daemon
from plugin.serving.deviceplugin.timing import Timing
from plugin.serving.dra.inventory import device_name

NODE = "fpga-node-1"
DRIVER = "accelerator.b-com.com"


async def run_migration_demo() -> int:
    return await told_in("dpdra", _story)


async def _story(root: Path) -> None:
    node = build_intel_node(root / "node")
    registry = root / "plugins_registry"
    registry.mkdir()
    async with ApiServerEmulator("1.36") as api:
        api.create_node(NODE)
        api.create_namespace("default")
        api.create_device_class(DRIVER, driver=DRIVER, extended_resource_name=RESOURCE)
        section("A 1.36 API server with a DeviceClass mapping b-com.com/accelerator to DRA")
        say(f"  DeviceClass {DRIVER}: devices of driver {DRIVER}, "
            f"extendedResourceName {RESOURCE}")

        async def wipe(node_name: str) -> None:
            from compat_tests.apiserver.client import ApiClient

            async with ApiClient(api.url, api.token, api.ca_file) as client:
                await client.delete("/apis/resource.k8s.io/v1/resourceslices",
                                    fieldSelector=f"spec.nodeName={node_name}")

        config = DraConfig(node_name=NODE, wipe_slices=wipe)
        settings = Settings(
            device_plugin_dir=root / "device-plugins", backend="intel",
            sysfs_root=node.sysfs_root, dev_root=node.dev_root, kubelet_check_interval=1.0,
            api="auto", node_name=NODE, kubeconfig=api.write_kubeconfig(root / "kubeconfig"),
            plugins_registry_dir=registry, dra_state_dir=root / "state",
            cdi_spec_dir=root / "cdi", watcher_wait=2.0,
            pod_resources_socket=root / "pod-resources" / "kubelet.sock",
            retry=RetryPolicy(attempts=3, max_backoff=0.2, register_timeout=5.0))

        async def boot(model: str) -> KubeletEmulator:
            kubelet = KubeletEmulator(settings.device_plugin_dir, model,
                                      plugins_registry=registry, reconcile_period=0.1,
                                      dra=config,
                                      pod_resources_socket=settings.pod_resources_socket)
            await kubelet.start()
            return kubelet

        section("The node's kubelet is 1.33 (no DRA); the plugin starts with --api auto")
        kubelet = await boot("1.33")
        daemon = Daemon(settings, make_backend("intel", node.config()),
                        timing=Timing(round_backoff_initial=0.2))
        serving = asyncio.create_task(daemon.run())
        ids = sorted(await kubelet.wait_for_devices(RESOURCE, timeout=15))
        legacy = await _device_plugin_pod(kubelet, "legacy-pod")

        section("The node is upgraded to 1.36 under the running plugin; legacy-pod keeps running")
        await kubelet.stop()
        began = time.perf_counter()
        kubelet = await boot("1.36")
        await _until(lambda: _slices(api), timeout=15)
        say(f"  {len(_slices(api))} ResourceSlice(s) published "
            f"{(time.perf_counter() - began) * 1000:.0f} ms after the 1.36 kubelet started; "
            f"the kubelet holds no device-plugin registration: "
            f"{not kubelet.is_connected(RESOURCE)}")
        device = _slices(api)[0]["spec"]["devices"][0]
        attributes = ", ".join(f"{k}={next(iter(v.values()))}"
                               for k, v in sorted(device["attributes"].items())[:5])
        say(f"  device {device['name']}: {attributes}, ...")
        held = device_name(legacy)
        await _until(lambda: _taints(api).get(held), timeout=15)
        say(f"  device {held} ({legacy}), still used by default/legacy-pod through the device "
            f"plugin: taint {_taints(api)[held]}")
        claim = await _dra_pod(api, kubelet, root / "cdi", ids)
        kubelet.end_pod("default", "legacy-pod")
        began = time.perf_counter()
        await _until(lambda: held in _taints(api) and not _taints(api)[held], timeout=15)
        say(f"  legacy-pod ends: {held} is offered through DRA "
            f"{(time.perf_counter() - began) * 1000:.0f} ms later, untainted")

        section("The node is downgraded back to 1.33; the DRA pod keeps running")
        await kubelet.stop()
        kubelet = await boot("1.33")
        claimed = claim[1]
        await kubelet.wait_for_devices(
            RESOURCE, lambda ds: claimed in ds and not ds[claimed].healthy, timeout=15)
        await _until(lambda: not _slices(api), timeout=15)
        say("  the slices are withdrawn; the device plugin serves the node again")
        say(f"  {claimed}, still prepared for claim default/{claim[0]}: Unhealthy to the "
            "kubelet, so no device-plugin pod gets it")
        await _device_plugin_pod(kubelet, "new-pod")
        api.set_claim_status("default", claim[0], {})  # its pod ended: the claim released
        began = time.perf_counter()
        await kubelet.wait_for_devices(RESOURCE, timeout=15)
        say(f"  the DRA pod ends and its claim is released: {claimed} Healthy "
            f"{(time.perf_counter() - began) * 1000:.0f} ms later")
        await _until(lambda: len(api.list("events", "default")) >= 4, timeout=15)
        say(f"  kubectl describe node {NODE}, Events:")
        for event in api.list("events", "default"):
            note = event["note"] if len(event["note"]) <= 110 else event["note"][:109] + "…"
            say(f"    {event['type']}  {event['reason']}  {note}")

        section("The plugin is stopped")
        daemon.stop()
        code = await serving
        await kubelet.stop()
        say(f"  exit code {code}")
        say()


def _slices(api: ApiServerEmulator) -> list[dict]:
    return [s for s in api.list("resourceslices") if s["spec"]["nodeName"] == NODE]


def _taints(api: ApiServerEmulator) -> dict[str, str]:
    """Device name -> its taints as kubectl would show them ("" when none)."""
    return {d["name"]: ", ".join(f"{t['key']}={t.get('value', '')}:{t['effect']}"
                                 for t in d.get("taints", []))
            for s in _slices(api) for d in s["spec"].get("devices", [])}


async def _device_plugin_pod(kubelet: KubeletEmulator, pod: str) -> str:
    chosen = sorted(i for i, d in kubelet.devices(RESOURCE).items() if d.healthy)[:1]
    granted = await kubelet.run_pod("default", pod, "main", RESOURCE, chosen)
    say(f"  pod {pod} asks for {RESOURCE}: 1 -> Allocate through {kubelet.generation}: "
        f"ACCELERATOR_UNITS={granted.envs['ACCELERATOR_UNITS']}")
    return chosen[0]


async def _dra_pod(api: ApiServerEmulator, kubelet: KubeletEmulator, cdi: Path,
                   device_ids: list[str]) -> tuple[str, str]:
    """A claim prepared on a free device for a pod that keeps running: (claim, device ID)."""
    assert kubelet.dra is not None
    await kubelet.dra.wait_until(lambda: kubelet.dra.endpoints(DRIVER), 15.0, "registered")
    device = next(name for name, taints in sorted(_taints(api).items()) if not taints)
    claim = api.create_allocated_claim("default", "pod-accelerators", driver=DRIVER, pool=NODE,
                                       devices=[device], node_name=NODE, reserved_for=[
                                           {"resource": "pods", "name": "dra-pod",
                                            "uid": "dra-pod-uid"}])
    say(f"  the same pod request ({RESOURCE}: 1) -> the scheduler's claim "
        f"default/pod-accelerators, allocated {NODE}/{device}")
    ref = ClaimRef("default", "pod-accelerators", claim["metadata"]["uid"], (DRIVER,))
    outcome = await kubelet.dra.prepare([ref])
    ids = outcome.cdi_ids(ref.uid)
    say(f"  NodePrepareResources -> CDI devices {', '.join(ids)}")
    show_container(cdi, ids)
    return "pod-accelerators", next(i for i in device_ids if device_name(i) == device)

