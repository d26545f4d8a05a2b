"""Two shares of one port in two containers started by a real CDI consumer (podman).

The real ``serve --api dra --dra-share intel=4`` writes its CDI specs into
``/var/run/cdi``; two claims allocated by the emulated 1.36 scheduler as shares of one port
are prepared through the emulated 1.36 kubelet; podman (with runc, Debian 12's 4.3.1 on CDI
library v0.5.2) then starts one container per claim with the CDI IDs the kubelet got, as a
runtime does for a pod's container. Each must get the port's device node and its own share's
``ACCELERATOR_SHARE_ID`` and ``ACCELERATOR_SHARE_CONTEXTS``: two claims whose specs name the
same device node do not collide in the runtime's CDI registry.

Root, podman, runc and a static busybox, as :mod:`compat_tests.test_cdi_runtime` needs them
(whose fixtures these are); without them it skips.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import pytest

from compat_tests.apiserver.allocate import allocate_claim
from compat_tests.dra_bench import DRIVER, NAMESPACE, NODE, Bench
from compat_tests.kubelet.dra_results import ClaimRef
from compat_tests.test_cdi_runtime import HOST_NODE, SPEC_DIR, host_node, podman, rootfs  # noqa: F401

pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="podman runs containers on host devices as root only")
CLASS = "shared.accelerator.b-com.com"


def run(podman: str, rootfs: Path, ids: tuple[str, ...], script: str  # noqa: F811
        ) -> subprocess.CompletedProcess:
    devices = [word for cdi_id in ids for word in ("--device", cdi_id)]
    return subprocess.run(
        [podman, "--runtime", "runc", "--cgroup-manager", "cgroupfs", "run", "--rm",
         "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1000:1000", "--network", "none",
         *devices, "--rootfs", str(rootfs), "/bin/sh", "-c", script],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def share(bench: Bench, name: str, contexts: int) -> tuple[ClaimRef, dict]:
    created = bench.api.create({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [{"name": "fpga", "exactly": {
            "deviceClassName": CLASS,
            "capacity": {"requests": {"contexts": str(contexts)}}}}]}}})
    claim = allocate_claim(bench.api, NAMESPACE, name, NODE)
    [result] = claim["status"]["allocation"]["devices"]["results"]
    return ClaimRef(NAMESPACE, name, created["metadata"]["uid"], (DRIVER,)), result


async def test_two_containers_get_one_port_each_with_its_own_share(
        dra_bench: Bench, podman: str, rootfs: Path, host_node: Path) -> None:  # noqa: F811
    bench = dra_bench
    bench.cdi = SPEC_DIR
    await bench.start_api()
    await bench.start_kubelet()
    plugin = bench.serve(bench.kubeconfig(), extra=["--dra-share", "intel=4"])
    claims: list[tuple[ClaimRef, dict]] = []
    try:
        await bench.published(plugin)
        bench.api.create({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                          "metadata": {"name": CLASS}, "spec": {"selectors": [
                              {"cel": {"expression": f'device.driver == "{DRIVER}"'}},
                              {"cel": {"expression": "device.allowMultipleAllocations"}}]}})
        claims += [share(bench, "first", 1), share(bench, "second", 3)]
        assert len({result["device"] for _, result in claims}) == 1, "one port, two shares"
        for (ref, result), contexts in zip(claims, (1, 3), strict=True):
            outcome = await bench.dra.prepare([ref])
            assert outcome.ok, outcome.error
            ids = outcome.cdi_ids(ref.uid)
            nodes = {n["hostPath"] for p in SPEC_DIR.glob("*.json")
                     for d in json.loads(p.read_text())["devices"]
                     for n in d["containerEdits"].get("deviceNodes", ())
                     if f"{json.loads(p.read_text())['kind']}={d['name']}" in ids}
            assert nodes == {str(HOST_NODE)}, nodes
            done = await asyncio.to_thread(
                run, podman, rootfs, ids, f"test -c {host_node} && echo "
                "$ACCELERATOR_SHARE_ID $ACCELERATOR_SHARE_CONTEXTS")
            assert done.returncode == 0, f"podman refused {ids}: {done.stderr}"
            assert done.stdout.split() == [result["shareID"], str(contexts)]
    finally:  # nothing of the test left in the runtime's spec directory, passed or not
        for ref, _ in claims:
            assert (await bench.dra.unprepare([ref])).ok
        assert await plugin.terminate() == 0
    assert not [p for p in SPEC_DIR.glob("*.json")
                if json.loads(p.read_text())["kind"].startswith(("b-com.com/",
                                                                  "accelerator.b-com.com/"))]
