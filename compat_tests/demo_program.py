"""``make demo DEMO=program``: the function a pod needs, loaded on demand.

A simulated node whose Intel ports all hold NLB3, an emulated 1.36 API server holding the
example DeviceClass ``nlb0.accelerator.b-com.com`` (deploy/examples/programming: it maps
``b-com.com/nlb0`` and names nlb0.gbs of the image library), an emulated 1.36 kubelet, and
the real daemon with ``--api dra --programming on``. A pod asks for ``b-com.com/nlb0: 1``;
the scheduler's claim (KEP-5004), allocated by the class's CEL selectors, carries the class's
configuration; at NodePrepareResources the driver checks the GBS, loads it into the port
through the FME's port-PR ioctl, waits until the port reports nlb0, and only then answers.
Then what a shared cluster's admin relies on: a tenant's claim naming a function the class
does not list is refused, and so is an image whose bytes are not the ones the class pins;
both leave the card untouched and say why on the claim. Last, with ``--program-at bind``,
a load that fails on the first card moves the pod to another (:mod:`.demo_program_bind`).

The ioctl is the one thing not real: a stand-in (:mod:`compat_tests.fake_port_pr`) checks
the request number, the struct and the very bitstream bytes against the kernel header's
layout, then rewrites the fake sysfs as the kernel would after a load.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from api_versions.retry import RetryPolicy
from compat_tests.apiserver import ApiServerEmulator, objects
from compat_tests.apiserver.allocate import extended_resource_claim
from compat_tests.demo import _until, say, section, show_container, told_in
from compat_tests.demo_program_bind import bind_scene
from compat_tests.dra_support import wiper
from compat_tests.fake_port_pr import FakePortPr
from compat_tests.fake_sysfs import DEFAULT_INTERFACE_ID, FakeNode
from compat_tests.fpga_images import NLB0_AFU_ID, NLB3_AFU_ID, build_gbs, write_image
from compat_tests.kubelet import KubeletEmulator
from compat_tests.kubelet.dra import DraConfig
from compat_tests.kubelet.dra_results import ClaimRef
from plugin.cli.config import Settings
from plugin.discovery.backends import make_backend
from plugin.process.daemon import Daemon
from plugin.programming.ids import dashed
from plugin.programming.loaders.intel_pr import PortPrIoctl
from plugin.serving.deviceplugin.timing import Timing
from plugin.serving.dra.share_setting import FamilyShare

NODE = "fpga-node-1"
DRIVER = "accelerator.b-com.com"
RESOURCE = "b-com.com/nlb0"
CLASS_FILE = Path(__file__).resolve().parents[1] / "deploy" / "examples" / "programming" / \
    "intel-nlb0.yaml"




async def run_programming_demo() -> int:
    return await told_in("dpprog", _story)


async def _story(root: Path) -> None:
    nlb3 = NLB3_AFU_ID.replace("-", "")
    node = FakeNode(root / "node")
    node.add_dfl_card("0000:3b:00.0", ports=2, numa_node=0, afu_id=nlb3)
    node.add_dfl_card("0000:d8:00.0", numa_node=1, afu_id=nlb3)
    library = root / "images"
    gbs = build_gbs(afu_ids=(NLB0_AFU_ID,), interface_id=dashed(DEFAULT_INTERFACE_ID),
                    name="nlb_400", bitstream=b"\x5a\xa5" * 4096)
    write_image(library, "nlb0.gbs", gbs)
    section("A simulated node: three Intel FPGA ports, every one holding NLB3")
    for device in sorted(make_backend("intel", node.config()).scan(), key=lambda d: d.id):
        say(f"  {device.id:<20} {device.attribute('port'):<12} afu {device.attribute('afu_id')}"
            f"  interface {device.attribute('interface_id')}")
    say(f"  the image library {library}: nlb0.gbs ({len(gbs)} bytes, AFU "
        f"{NLB0_AFU_ID}, built for interface {dashed(DEFAULT_INTERFACE_ID)})")

    async with ApiServerEmulator("1.36") as api:
        api.create_node(NODE)
        api.create_namespace("default")
        device_class = yaml.safe_load(CLASS_FILE.read_text())
        api.create(device_class)
        section("The admin's catalogue: one DeviceClass per function")
        say(f"  DeviceClass {device_class['metadata']['name']} (deploy/examples/programming): "
            f"extendedResourceName {device_class['spec']['extendedResourceName']}, "
            f"{len(device_class['spec']['selectors'])} CEL selectors (driver, family, "
            "interface, programmable or holding nlb0), config FpgaFunction afuID "
            f"{device_class['spec']['config'][0]['opaque']['parameters']['afuID']} "
            f"image {device_class['spec']['config'][0]['opaque']['parameters']['image']}")

        # a small PR takes about a second
        world = await start_programming_node(root, node, api, library, gbs, load_delay=1.0)
        kubelet, port_pr = world.kubelet, world.port_pr
        section("The plugin serves the node through DRA, --programming on")
        await _until(lambda: len(_devices(api)) == 3, timeout=15)
        assert kubelet.dra is not None
        await kubelet.dra.wait_until(lambda: kubelet.dra.endpoints(DRIVER), 15.0, "registered")
        for device in _devices(api):
            attributes = device["attributes"]
            say(f"  {device['name']}: afuID {attributes['afuID']['string']}, programmable "
                f"{attributes['programmable']['bool']}")

        section(f"A pod asks for {RESOURCE}: 1; no port holds nlb0")
        claim, ids = await _pod(api, kubelet, "nlb0-pod")
        call = port_pr.calls[-1]
        say(f"  the driver's ioctl on {call.node}: request {call.request:#06x} "
            f"(DFL_FPGA_FME_PORT_PR), argsz {call.fields['argsz']}, port_id "
            f"{call.fields['port_id']}, {call.fields['buffer_size']} bytes: the GBS's "
            f"bitstream {'exactly' if call.payload_matched else 'NOT'}")
        device = claim["status"]["allocation"]["devices"]["results"][0]["device"]
        await _until(lambda: _afu(api, device) == NLB0_AFU_ID.replace("-", ""), timeout=15)
        say(f"  {device} republished with afuID {_afu(api, device)}")
        say(f"  NodePrepareResources -> CDI devices {', '.join(ids)}")
        show_container(root / "cdi", ids)
        await _until(lambda: _status(api, claim), timeout=15)
        entry = _status(api, claim)[0]
        say(f"  kubectl describe resourceclaim: {entry['data']['functionLoaded']}; "
            + ", ".join(f"{c['type']}={c['status']} ({c['reason']})"
                        for c in entry["conditions"]))
        await _until(lambda: _events(api, "FunctionLoaded"), timeout=15)
        say(f"  kubectl describe node {NODE}, Events:")
        for event in _events(api, "FunctionLoaded"):
            say(f"    {event['type']}  {event['reason']}  {event['note']}")

        section(f"A second pod asks for {RESOURCE}: 1; the scheduler picks the port with nlb0")
        loads = len(port_pr.calls)
        claim, ids = await _pod(api, kubelet, "nlb0-pod-2", release=claim)
        say(f"  loads this time: {len(port_pr.calls) - loads} (the port holds nlb0: the fast "
            "path)")
        entry = await _status_when(api, claim)
        say(f"  kubectl describe resourceclaim: {entry['data']['functionLoaded']}")

        held = claim["status"]["allocation"]["devices"]["results"][0]["device"]
        free = next(d["name"] for d in _devices(api) if d["name"] != held)
        await _tenant_refused(api, kubelet, device_class, free, port_pr)
        await _digest_mismatch(api, kubelet, device_class, free, port_pr, library)

        section("The plugin is stopped")
        say(f"  exit code {await world.stop()}")
    await bind_scene(root, gbs, CLASS_FILE, nlb3)
    say()


@dataclass
class ProgrammingNode:
    """A real daemon serving a simulated Intel node through DRA with programming on, its
    emulated 1.36 kubelet, and the stand-in for the port-PR ioctl that records each load."""

    kubelet: KubeletEmulator
    port_pr: FakePortPr
    daemon: Daemon
    serving: asyncio.Task[int]

    async def stop(self) -> int:
        """Stop the daemon, then the kubelet; the daemon's exit code."""
        self.daemon.stop()
        code = await self.serving
        await self.kubelet.stop()
        return code


async def start_programming_node(root: Path, node: FakeNode, api: ApiServerEmulator,
                                 library: Path, gbs: bytes, *, load_delay: float = 0.0,
                                 dra_share: tuple[FamilyShare, ...] = ()) -> ProgrammingNode:
    """Start the kubelet and the daemon of the programming demos (``--programming on``,
    loading ``gbs`` through the ioctl stand-in in ``load_delay`` seconds)."""
    registry = root / "plugins_registry"
    registry.mkdir()
    kubelet = KubeletEmulator(root / "device-plugins", "1.36", plugins_registry=registry,
                              reconcile_period=0.1,
                              dra=DraConfig(node_name=NODE, wipe_slices=wiper(api)))
    await kubelet.start()
    settings = Settings(
        device_plugin_dir=root / "device-plugins", backend="intel",
        sysfs_root=node.sysfs_root, dev_root=node.dev_root, api="dra", node_name=NODE,
        kubeconfig=api.write_kubeconfig(root / "kubeconfig"),
        plugins_registry_dir=registry, dra_state_dir=root / "state",
        cdi_spec_dir=root / "cdi", programming="on", image_library=library,
        dra_share=dra_share, health_interval=0.1,
        retry=RetryPolicy(attempts=3, max_backoff=0.2, register_timeout=5.0))
    port_pr = FakePortPr(node, [gbs], delay=load_delay)
    daemon = Daemon(settings, make_backend("intel", node.config()),
                    timing=Timing(round_backoff_initial=0.2),
                    loaders={"intel": PortPrIoctl(node.dev_root, ioctl=port_pr)})
    return ProgrammingNode(kubelet, port_pr, daemon, asyncio.create_task(daemon.run()))


async def _pod(api: ApiServerEmulator, kubelet: KubeletEmulator, pod: str,
               release: dict | None = None) -> tuple[dict, tuple[str, ...]]:
    """The pod's extended-resource claim allocated and prepared: (claim, CDI IDs)."""
    if release is not None:  # the first pod ended: its claim released, unprepared
        assert kubelet.dra is not None
        ref = ClaimRef("default", release["metadata"]["name"], release["metadata"]["uid"],
                       (DRIVER,))
        await kubelet.dra.unprepare([ref])
        api.delete("resourceclaims", release["metadata"]["name"], "default")
    claim = extended_resource_claim(api, "default", pod, "main", RESOURCE, 1, node_name=NODE)
    device = claim["status"]["allocation"]["devices"]["results"][0]["device"]
    config = claim["status"]["allocation"]["devices"]["config"][0]
    say(f"  the scheduler's claim default/{claim['metadata']['name']}: {device} "
        f"(afuID {_afu(api, device)}), config from {config['source']}")
    ref = ClaimRef("default", claim["metadata"]["name"], claim["metadata"]["uid"], (DRIVER,))
    assert kubelet.dra is not None
    began = time.perf_counter()
    outcome = await kubelet.dra.prepare([ref])
    took = (time.perf_counter() - began) * 1000
    result = outcome.result(ref.uid)
    if not result.ok:
        raise RuntimeError(f"prepare failed: {result.error}")
    say(f"  NodePrepareResources answered in {took:.0f} ms")
    return claim, outcome.cdi_ids(ref.uid)


async def _tenant_refused(api: ApiServerEmulator, kubelet: KubeletEmulator,
                          device_class: dict, device: str, port_pr: FakePortPr) -> None:
    """A tenant's claim of the nlb0 class naming its own function: the class lists none."""
    section("A tenant's claim asks the nlb0 class for its own function, nlb3")
    parameters = {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "FpgaFunction",
                  "afuID": NLB3_AFU_ID, "image": "nlb3.gbs"}
    ref = _allocated(api, "tenant-a", "tenant-claim", device_class, device,
                     {"source": "FromClaim", "requests": ["fpga"],
                      "opaque": {"driver": DRIVER, "parameters": parameters}})
    await _refused(api, kubelet, ref, port_pr, "FunctionNotAllowed")


async def _digest_mismatch(api: ApiServerEmulator, kubelet: KubeletEmulator,
                           device_class: dict, device: str, port_pr: FakePortPr,
                           library: Path) -> None:
    """A class pinning nlb0.gbs's bytes, and the file replaced on the node since."""
    section("The admin pins nlb0.gbs by sha256; the file on the node is replaced since")
    image = library / "nlb0.gbs"
    pinned = hashlib.sha256(image.read_bytes()).hexdigest()
    say(f"  the class's FpgaFunction: sha256 {pinned}")
    image.write_bytes(image.read_bytes()[:-16] + b"\0" * 16)
    say(f"  nlb0.gbs on the node now: sha256 {hashlib.sha256(image.read_bytes()).hexdigest()}")
    config = device_class["spec"]["config"][0]
    parameters = {**config["opaque"]["parameters"], "sha256": pinned}
    ref = _allocated(api, "default", "pinned-claim", device_class, device,
                     {"source": "FromClass", "requests": ["fpga"],
                      "opaque": {"driver": DRIVER, "parameters": parameters}})
    await _refused(api, kubelet, ref, port_pr, "ImageDigestMismatch")


def _allocated(api: ApiServerEmulator, namespace: str, name: str, device_class: dict,
               device: str, *config: dict) -> ClaimRef:
    api.create_namespace(namespace)
    api.create_claim(namespace, name, [("fpga", device_class["metadata"]["name"])])
    obj = api.set_claim_status(namespace, name, {
        "allocation": objects.allocation([objects.result("fpga", DRIVER, NODE, device)],
                                         node_name=NODE, config=config),
        "reservedFor": [objects.pod_reference(f"{name}-pod", f"{name}-pod-uid")]})
    return ClaimRef(namespace, name, obj["metadata"]["uid"], (DRIVER,))


async def _refused(api: ApiServerEmulator, kubelet: KubeletEmulator, ref: ClaimRef,
                   port_pr: FakePortPr, reason: str) -> None:
    assert kubelet.dra is not None
    loads = len(port_pr.calls)
    result = (await kubelet.dra.prepare([ref])).result(ref.uid)
    say(f"  NodePrepareResources for {ref.namespace}/{ref.name}: refused")
    say(f"    {result.error}")
    say(f"  loads this time: {len(port_pr.calls) - loads}; the port is untouched and healthy")
    await _until(lambda: _claim_events(api, ref, reason), timeout=15)
    say(f"  kubectl describe resourceclaim -n {ref.namespace} {ref.name}, Events:")
    for event in _claim_events(api, ref, reason):
        say(f"    {event['type']}  {event['reason']}  {event['note'][:400]}")


def _claim_events(api: ApiServerEmulator, ref: ClaimRef, reason: str) -> list[dict]:
    return [e for e in api.list("events", ref.namespace) if e["reason"] == reason
            and e["regarding"].get("name") == ref.name]


def _devices(api: ApiServerEmulator) -> list[dict]:
    return sorted((d for s in api.list("resourceslices") if s["spec"]["nodeName"] == NODE
                   for d in s["spec"].get("devices", [])), key=lambda d: d["name"])


def _afu(api: ApiServerEmulator, device: str) -> str:
    return next(d["attributes"]["afuID"]["string"] for d in _devices(api) if d["name"] == device)


def _status(api: ApiServerEmulator, claim: dict) -> list[dict]:
    obj = api.get("resourceclaims", claim["metadata"]["name"], "default") or {}
    return list(obj.get("status", {}).get("devices", []))


async def _status_when(api: ApiServerEmulator, claim: dict) -> dict:
    await _until(lambda: _status(api, claim), timeout=15)
    return _status(api, claim)[0]


def _events(api: ApiServerEmulator, reason: str) -> list[dict]:
    return [e for e in api.list("events", "default") if e["reason"] == reason]
