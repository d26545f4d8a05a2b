"""``make demo DEMO=share``: three pods on one FPGA port holding one function.

A simulated node with one Intel port holding NLB3, an image library whose nlb0.gbs declares
four users (``afu-image.accelerator-clusters[0].total-contexts``), an emulated 1.36 API
server (DRAConsumableCapacity on) holding the example DeviceClasses
``nlb0.accelerator.b-com.com`` (deploy/examples/programming: loads nlb0) and
``nlb0-shared.accelerator.b-com.com`` (deploy/examples/sharing: shares of a port holding
nlb0), an emulated scheduler and 1.36 kubelet, and the real daemon with ``--api dra
--programming on --dra-share intel=image``. A first pod has nlb0 loaded; once it is gone the
port holds a function the driver loaded from an image that says it serves four, and is
published shared. Three pods then hold shares of it at once (1, 1 and 2 contexts), each with
its own ``shareID`` and environment; a fourth finds no contexts left; a pod asking for
another function is given a share by the scheduler and refused by the driver, which never
reprograms a shared port; the last share to go leaves the port shared for the next pods.

The port-PR ioctl is the one thing not real (:mod:`compat_tests.fake_port_pr`), as in
``make demo DEMO=program``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import yaml

from compat_tests.apiserver import ApiServerEmulator
from compat_tests.apiserver.allocate import (
    AllocationError,
    allocate_claim,
    extended_resource_claim,
)
from compat_tests.demo import _until, say, section, told_in
from compat_tests.demo_program import _devices, _pod, start_programming_node
from compat_tests.fake_port_pr import FakePortPr
from compat_tests.fake_sysfs import DEFAULT_INTERFACE_ID, FakeNode
from compat_tests.fpga_images import NLB0_AFU_ID, NLB3_AFU_ID, build_gbs, write_image
from compat_tests.kubelet import KubeletEmulator
from compat_tests.kubelet.dra_results import ClaimRef
from plugin.discovery.backends import make_backend
from plugin.programming.ids import dashed
from plugin.serving.dra.share_setting import parse_shares

NODE = "fpga-node-1"
DRIVER = "accelerator.b-com.com"
NAMESPACE = "default"
EXAMPLES = Path(__file__).resolve().parents[1] / "deploy" / "examples"
LOADING_CLASS = EXAMPLES / "programming" / "intel-nlb0.yaml"
SHARED_CLASS = EXAMPLES / "sharing" / "intel-nlb0-shared.yaml"
CONTEXTS = 4
"""What nlb0.gbs says it serves."""


async def run_sharing_demo() -> int:
    return await told_in("dpshare", _story)


async def _story(root: Path) -> None:
    nlb0, nlb3 = (afu.replace("-", "") for afu in (NLB0_AFU_ID, NLB3_AFU_ID))
    node = FakeNode(root / "node")
    node.add_dfl_card("0000:3b:00.0", numa_node=0, afu_id=nlb3)
    library = root / "images"
    gbs = build_gbs(afu_ids=(NLB0_AFU_ID,), interface_id=dashed(DEFAULT_INTERFACE_ID),
                    name="nlb_400", contexts=CONTEXTS)
    write_image(library, "nlb0.gbs", gbs)
    section("A simulated node: one Intel FPGA port, holding NLB3")
    [port] = make_backend("intel", node.config()).scan()
    say(f"  {port.id:<20} afu {port.attribute('afu_id')}")
    say(f"  the image library: nlb0.gbs (AFU {NLB0_AFU_ID}), whose metadata says "
        f"accelerator-clusters[0].total-contexts {CONTEXTS}")

    async with ApiServerEmulator("1.36") as api:
        api.create_node(NODE)
        api.create_namespace(NAMESPACE)
        loading = yaml.safe_load(LOADING_CLASS.read_text())
        shared = yaml.safe_load(SHARED_CLASS.read_text())
        for device_class in (loading, shared, _other_function(loading)):
            api.create(device_class)
        section("The admin's catalogue")
        say(f"  DeviceClass {loading['metadata']['name']} (deploy/examples/programming): "
            "loads nlb0.gbs for pods asking for b-com.com/nlb0")
        say(f"  DeviceClass {shared['metadata']['name']} (deploy/examples/sharing): shares "
            "of a port published shared (allowMultipleAllocations) holding nlb0")
        say("  DeviceClass nlb3.accelerator.b-com.com: loads nlb3.gbs for pods asking for "
            "b-com.com/nlb3")

        world = await start_programming_node(root, node, api, library, gbs,
                                             dra_share=parse_shares("intel=image"))
        kubelet, port_pr = world.kubelet, world.port_pr
        section("The plugin serves the node through DRA, --dra-share intel=image")
        await _until(lambda: len(_devices(api)) == 1, timeout=15)
        assert kubelet.dra is not None
        await kubelet.dra.wait_until(lambda: kubelet.dra.endpoints(DRIVER), 15.0, "registered")
        _show_published(api, "NLB3 was not loaded by this driver, so its image is unknown")

        section("A pod asks for b-com.com/nlb0: 1; the driver loads nlb0, and the pod ends")
        claim, _ = await _pod(api, kubelet, "loader-pod")
        name = claim["metadata"]["name"]
        await kubelet.dra.unprepare([ClaimRef(NAMESPACE, name, claim["metadata"]["uid"],
                                              (DRIVER,))])
        api.delete("resourceclaims", name, NAMESPACE)
        await _until(lambda: _published(api).get("allowMultipleAllocations") is True,
                     timeout=15)
        _show_published(api, f"it holds nlb0, loaded by this driver from nlb0.gbs ({CONTEXTS} "
                        "users)")

        section(f"Three pods, each with a claim of {shared['metadata']['name']}")
        refs = []
        for index, contexts in enumerate((1, 1, 2)):
            refs.append(_allocated(api, f"worker-{index}", shared, contexts))
        for ref in refs:
            await _prepared(kubelet, ref, root / "cdi")
        await _until(lambda: all(_status(api, ref) for ref in refs), timeout=15)
        say("  kubectl get resourceclaims -o yaml, status.devices (written by the driver):")
        for ref in refs:
            [entry] = _status(api, ref)
            ready = next(c for c in entry["conditions"] if c["type"] == "Ready")
            say(f"    {ref.name}: device {entry['device']} shareID {entry['shareID']} "
                f"Ready={ready['status']} ({ready['reason']}), contexts "
                f"{entry['data']['contexts']}")

        section("A fourth pod asks for 1 context")
        try:
            _allocated(api, "worker-3", shared, 1)
        except AllocationError as refusal:
            say(f"  the scheduler: {refusal}")
            say("  (the pod stays Pending until a share is released)")

        section("worker-0 ends: its share is unprepared, the other two run on")
        await kubelet.dra.unprepare([refs[0]])
        api.delete("resourceclaims", refs[0].name, NAMESPACE)
        say(f"  the port still holds afuID {_published(api)['attributes']['afuID']['string']}"
            f" (nlb0) for the two other shares; loads so far: {len(port_pr.calls)}")

        section("A pod asks for b-com.com/nlb3: 1; the scheduler gives it the free context")
        await _other_refused(api, kubelet, port_pr, nlb0)

        section("The last two pods end")
        ends = ("worker-2's share runs on", "the port's last share")
        for ref, what in zip(refs[1:], ends, strict=True):
            outcome = await kubelet.dra.unprepare([ref])
            api.delete("resourceclaims", ref.name, NAMESPACE)
            say(f"  NodeUnprepareResources for {ref.name} ({what}): "
                f"{'done' if outcome.ok else outcome.error}")
        left = sorted(p.name for p in (root / "cdi").glob("*_claim_*.json"))
        say(f"  CDI specs of claims left: {', '.join(left) or 'none'}; loads so far: "
            f"{len(port_pr.calls)} (no class of these pods clears on unprepare)")
        _show_published(api, "the last share is gone; the port keeps nlb0 for the next pods")

        section("The plugin is stopped")
        code = await world.stop()
        say(f"  exit code {code}")
        say()


def _other_function(loading: dict[str, Any]) -> dict[str, Any]:
    """The example loading class, made for NLB3 (its function, image and resource)."""
    other = copy.deepcopy(loading)
    nlb0, nlb3 = (afu.replace("-", "") for afu in (NLB0_AFU_ID, NLB3_AFU_ID))
    other["metadata"]["name"] = "nlb3.accelerator.b-com.com"
    other["spec"]["extendedResourceName"] = "b-com.com/nlb3"
    for selector in other["spec"]["selectors"]:
        selector["cel"]["expression"] = selector["cel"]["expression"].replace(nlb0, nlb3)
    parameters = other["spec"]["config"][0]["opaque"]["parameters"]
    parameters.update(afuID=nlb3, image="nlb3.gbs")
    return other


def _published(api: ApiServerEmulator) -> dict[str, Any]:
    [device] = _devices(api)
    return device


def _show_published(api: ApiServerEmulator, why: str) -> None:
    device = _published(api)
    say(f"  ResourceSlice device {device['name']}: afuID "
        f"{device['attributes']['afuID']['string']}")
    if device.get("allowMultipleAllocations"):
        contexts = device["capacity"]["contexts"]
        policy = contexts["requestPolicy"]
        say(f"    allowMultipleAllocations: true, capacity contexts: {contexts['value']} "
            f"(requestPolicy default {policy['default']}, validRange "
            f"{policy['validRange']['min']}..{policy['validRange']['max']} step "
            f"{policy['validRange']['step']})")
        say(f"    published shared: {why}")
    else:
        say(f"    published whole (no allowMultipleAllocations): {why}")


def _allocated(api: ApiServerEmulator, name: str, device_class: dict[str, Any],
               contexts: int) -> ClaimRef:
    """A pod's claim asking ``contexts`` of a device of ``device_class``, as its
    ResourceClaimTemplate makes it, allocated by the emulated scheduler."""
    created = api.create({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [{"name": "fpga", "exactly": {
            "deviceClassName": device_class["metadata"]["name"],
            "capacity": {"requests": {"contexts": str(contexts)}}}}]}}})
    try:
        claim = allocate_claim(api, NAMESPACE, name, NODE)
    except AllocationError:
        api.delete("resourceclaims", name, NAMESPACE)
        raise
    [result] = claim["status"]["allocation"]["devices"]["results"]
    say(f"  claim {name}: {result['device']} shareID {result['shareID']} consumedCapacity "
        f"contexts {result['consumedCapacity']['contexts']}")
    return ClaimRef(NAMESPACE, name, created["metadata"]["uid"], (DRIVER,))


async def _prepared(kubelet: KubeletEmulator, ref: ClaimRef, cdi: Path) -> None:
    assert kubelet.dra is not None
    outcome = await kubelet.dra.prepare([ref])
    result = outcome.result(ref.uid)
    if not result.ok:
        raise RuntimeError(f"prepare failed: {result.error}")
    [device] = result.devices
    env = _env(cdi, outcome.cdi_ids(ref.uid))
    say(f"  {ref.name}'s container (share_id {device.share_id} in the kubelet's answer): "
        + " ".join(f"{k}={env[k]}" for k in ("ACCELERATOR_DEVICES", "ACCELERATOR_SHARE_ID",
                                            "ACCELERATOR_SHARE_CONTEXTS")))


def _status(api: ApiServerEmulator, ref: ClaimRef) -> list[dict[str, Any]]:
    claim = api.get("resourceclaims", ref.name, NAMESPACE) or {}
    return list(claim.get("status", {}).get("devices", []))


def _env(cdi: Path, ids: tuple[str, ...]) -> dict[str, str]:
    """The variables the CDI devices ``ids`` give a container, from the specs on disk."""
    env: dict[str, str] = {}
    for spec_file in sorted(cdi.glob("*.json")):
        spec = json.loads(spec_file.read_text())
        for entry in spec["devices"]:
            if f"{spec['kind']}={entry['name']}" in ids:
                env.update(e.split("=", 1) for e in entry["containerEdits"].get("env", []))
    return env


async def _other_refused(api: ApiServerEmulator, kubelet: KubeletEmulator,
                         port_pr: FakePortPr, nlb0: str) -> None:
    claim = extended_resource_claim(api, NAMESPACE, "nlb3-pod", "main", "b-com.com/nlb3", 1,
                                    node_name=NODE)
    [result] = claim["status"]["allocation"]["devices"]["results"]
    say(f"  the scheduler's claim {claim['metadata']['name']}: {result['device']} shareID "
        f"{result['shareID']} (the class selects programmable ports; this one is shared)")
    ref = ClaimRef(NAMESPACE, claim["metadata"]["name"], claim["metadata"]["uid"], (DRIVER,))
    assert kubelet.dra is not None
    loads = len(port_pr.calls)
    error = (await kubelet.dra.prepare([ref])).result(ref.uid).error
    say("  NodePrepareResources: refused")
    say(f"    {error}")
    say(f"  loads this time: {len(port_pr.calls) - loads}; the port still holds afuID "
        f"{_published(api)['attributes']['afuID']['string']}"
        + (" (nlb0)" if _published(api)["attributes"]["afuID"]["string"] == nlb0 else ""))
