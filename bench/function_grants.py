"""What ``--function-grants`` costs a prepare, as the kubelet sees it.

The real ``serve --api dra`` between an emulated 1.36 API server and kubelet
(:mod:`bench.dra_world`), beside the reference driver, twice: as shipped without function
admission, and with ``--function-grants kube-system``, a catalogue guarding the class of the
function every port holds, and the claims' namespace granted it, so that every prepare takes
the whole check (the catalogue, the DeviceClasses, the claim's Namespace). Each world runs
:data:`CLAIMS` claims of one device, one NodePrepareResources each, interleaved with the
reference driver's (:func:`bench.dra.interleaved_claims`); the figures compare each world's
median to its own reference, so a busier moment of the machine weighs on both. Also counted: the API
reads the check made per prepare (each read is kept 2 s, so a burst shares them).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

from bench.dra import interleaved_claims
from bench.dra_world import DRIVER, NAMESPACE, DraWorld, dra_world
from bench.table import Row, median, p50_p99
from compat_tests.fake_sysfs import DEFAULT_AFU_ID, build_intel_node
from plugin.programming.guarded import CATALOGUE_LABELS, GRANT_LABEL_PREFIX

CLAIMS = 300
WARM_UP = 50
PORTS = 6
CATALOGUE_NAMESPACE = "kube-system"
GUARDED_CLASS = "nlb0.accelerator.b-com.com"
GRANTS = ("--function-grants", CATALOGUE_NAMESPACE, "--guarded-classes", GUARDED_CLASS)
READS = (("get", "namespaces"), ("list", "configmaps"), ("list", "deviceclasses"))


def _guard_what_ports_hold(world: DraWorld) -> None:
    """The catalogue, the class of the ports' function, and the claims' namespace granted."""
    api = world.api
    api.create_namespace(CATALOGUE_NAMESPACE)
    api.core.put_config_map(CATALOGUE_NAMESPACE, "function-grants", {GUARDED_CLASS: ""},
                            dict(CATALOGUE_LABELS))
    api.create({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                "metadata": {"name": GUARDED_CLASS},
                "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}],
                         "config": [{"opaque": {"driver": DRIVER, "parameters": {
                             "apiVersion": f"{DRIVER}/v1alpha1", "kind": "FpgaFunction",
                             "afuID": DEFAULT_AFU_ID, "image": "intel/nlb0.gbs"}}}]}})
    api.core.label_namespace(NAMESPACE, GRANT_LABEL_PREFIX + GUARDED_CLASS, "true")


async def _world(root: Path, grants: bool) -> tuple[dict[str, list[float]],
                                                     dict[str, list[float]], int]:
    """(our prepares, the reference's, API reads of the check) in one world; a prepare
    refused (a wrong grant here) stops the bench (:func:`bench.dra.interleaved_claims`)."""
    node = build_intel_node(root / "node")
    flags = GRANTS if grants else ()
    async with dra_world(root, node, PORTS, root / "serve.stderr", flags=flags) as world:
        if grants:
            _guard_what_ports_hold(world)
        await interleaved_claims(world, 0, WARM_UP, "warm-")
        world.api.clear_requests()
        figures = await interleaved_claims(world, CLAIMS, 0, "timed-")
        reads = sum(len(world.api.find_requests(verb, resource)) for verb, resource in READS)
        if grants and not world.api.find_requests("get", "namespaces"):
            raise RuntimeError("the check never read the claims' Namespace: is the ports' "
                               "function guarded?")
    return figures["ours"]["prepare"], figures["reference"]["prepare"], reads


def run() -> list[Row]:
    results = {}
    for grants in (False, True):
        root = Path(tempfile.mkdtemp(prefix="dpgrants", dir="/tmp"))
        try:
            (root / "world").mkdir()
            results[grants] = asyncio.run(_world(root / "world", grants))
        finally:
            shutil.rmtree(root, ignore_errors=True)
    plain, plain_reference, _ = results[False]
    granted, granted_reference, reads = results[True]
    plain_ratio = median(plain) / median(plain_reference)
    granted_ratio = median(granted) / median(granted_reference)
    return [
        Row("DRA prepare without function grants, p50 / p99",
            p50_p99(plain), "",
            f"{CLAIMS} claims of one port, kubelet-side; {plain_ratio:.2f}x the reference "
            "driver's median in the same world"),
        Row("DRA prepare with --function-grants, p50 / p99",
            p50_p99(granted), "",
            f"{CLAIMS} claims of a port holding a guarded function, namespace granted; "
            f"{granted_ratio:.2f}x the reference driver's median in the same world"),
        Row("DRA prepare, function grants' cost (ratio of ratios)",
            f"{granted_ratio / plain_ratio:.2f}x", "",
            f"API reads of the check: {reads} for {CLAIMS} prepares "
            f"({reads / CLAIMS:.2f} each; Namespace, catalogue and DeviceClasses, each kept "
            "2 s)"),
    ]
