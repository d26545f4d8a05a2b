"""CDI specs read by a real container runtime: what ``serve`` writes, podman injects.

The CDI unit tests check specs against rules written out from the CDI library; this checks
them against the library itself, as a runtime ships it: the real ``serve`` writes its specs
into ``/var/run/cdi``, an emulated kubelet allocates, and podman (with runc) starts a
container with each device named in ``cdi_devices``. Debian 12's podman 4.3.1 is built on CDI
library v0.5.2, which reads specs up to 0.5.0 and refuses a device with nothing to inject:
a resource name with a dot in it used to give a 0.6.0 spec that podman answered with
``unresolvable CDI devices``.

The same for DRA shares (KEP-5075): two claims allocated by the emulated 1.36 scheduler as
shares of one port, prepared through the emulated kubelet, each claim's CDI IDs given to a
container of its own: the port's node in both, each share's own ``ACCELERATOR_SHARE_ID`` and
``ACCELERATOR_SHARE_CONTEXTS``, with both claims' specs in the runtime's registry at once.

Needs root, podman, runc and a static busybox (the container's root filesystem); without
root it skips, and a missing tool skips it too, naming the package, or fails it under
``CI=true`` (tests/system_tools.py). ``.ci/install-test-tools`` installs them.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from compat_tests.apiserver.allocate import allocate_claim
from compat_tests.dra_bench import DRIVER, NAMESPACE, NODE, Bench
from compat_tests.fake_sysfs import FakeNode
from compat_tests.kubelet.dra_results import ClaimRef
from tests.cdi_conformance import check
from tests.system_tools import BUSYBOX, PODMAN, RUNC, needs_tool

SPEC_DIR = Path("/var/run/cdi")
"""One of the two directories a runtime reads specs from."""
SETTLE = 15.0
HOST_NODE = Path("/dev/dfl-port.0")
"""Where a DFL port's node is on the host; the fake tree's port 0 points the spec here."""


pytestmark = pytest.mark.skipif(os.geteuid() != 0,
                                reason="podman runs containers on host devices as root only")


@pytest.fixture(autouse=True)
def podman() -> str:
    """The runtime and its OCI runtime, looked for before anything is started."""
    needs_tool("runc", RUNC)
    return needs_tool("podman", PODMAN)


@pytest.fixture
def rootfs(tmp_path: Path) -> Path:
    """The smallest root filesystem podman can run a shell in (Debian's static busybox)."""
    busybox = needs_tool("busybox", BUSYBOX, at=Path("/bin/busybox"))
    root = tmp_path / "rootfs"
    (root / "bin").mkdir(parents=True)
    shutil.copy(busybox, root / "bin" / "busybox")
    for tool in ("sh", "test", "ls"):
        (root / "bin" / tool).symlink_to("busybox")
    return root


@pytest.fixture
def host_node() -> Iterator[Path]:
    """A character device where the spec says the port's node is (``/dev/null``'s numbers),
    made for the test and removed after; a node already there is never touched."""
    if HOST_NODE.exists() or HOST_NODE.is_symlink():
        pytest.skip(f"{HOST_NODE} exists on this machine; not replacing it")
    os.mknod(HOST_NODE, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    try:
        yield HOST_NODE
    finally:
        HOST_NODE.unlink(missing_ok=True)


def run_in_container(podman: str, rootfs: Path, devices: Sequence[str],
                     script: str) -> subprocess.CompletedProcess:
    """``script`` in a container started with the CDI devices ``devices``."""
    named = [word for device in devices for word in ("--device", device)]
    return subprocess.run(
        [podman, "--runtime", "runc", "--cgroup-manager", "cgroupfs", "run", "--rm",
         "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1000:1000", "--network", "none",
         *named, "--rootfs", str(rootfs), "/bin/sh", "-c", script],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("class_part", ["fpga", "fpga.v2"])
async def test_podman_injects_what_serve_names(kubelet, plugin, tmp_path, podman, rootfs,
                                               host_node, class_part):
    fake = FakeNode(tmp_path / "node")
    fake.add_dfl_card("0000:3b:00.0")
    resource = f"e2e-{uuid.uuid4().hex[:8]}.example.com/{class_part}"
    node = await kubelet("1.32")
    daemon = plugin(extra=[
        "--backend", "intel", "--sysfs-root", str(fake.sysfs_root), "--dev-root",
        str(fake.dev_root), "--resource-name", resource, "--cdi", "--cdi-spec-dir",
        str(SPEC_DIR), "--device-list-strategy", "cdi"])
    try:
        await node.wait_for_devices(resource, timeout=SETTLE)
        answer = await node.allocate(resource, ["0000:3b:00.0"])
        [name] = answer.cdi_devices
        kind = name.partition("=")[0]
        [written] = [json.loads(p.read_text()) for p in SPEC_DIR.glob("*.json")
                     if json.loads(p.read_text()).get("kind") == kind]
        check(written)
        assert written["cdiVersion"] == "0.5.0"
        result = await asyncio.to_thread(
            run_in_container, podman, rootfs, [name], f"test -c {host_node}")
        assert result.returncode == 0, f"podman refused {name}: {result.stderr}"
    finally:
        assert await daemon.terminate() == 0
    assert not [p for p in SPEC_DIR.glob("*.json")
                if json.loads(p.read_text()).get("kind") == kind], "spec removed on stop"


SHARED_CLASS = "shared.accelerator.b-com.com"


def _share(bench: Bench, name: str, contexts: int) -> tuple[ClaimRef, dict]:
    """A claim asking ``contexts`` of a shared port, allocated by the emulated scheduler."""
    created = bench.api.create({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [{"name": "fpga", "exactly": {
            "deviceClassName": SHARED_CLASS,
            "capacity": {"requests": {"contexts": str(contexts)}}}}]}}})
    claim = allocate_claim(bench.api, NAMESPACE, name, NODE)
    [result] = claim["status"]["allocation"]["devices"]["results"]
    return ClaimRef(NAMESPACE, name, created["metadata"]["uid"], (DRIVER,)), result


async def test_two_containers_get_one_port_each_with_its_own_dra_share(
        dra_bench: Bench, podman, rootfs, host_node) -> None:
    bench = dra_bench
    bench.cdi = SPEC_DIR
    await bench.start_api()
    await bench.start_kubelet()
    plugin = bench.serve(bench.kubeconfig(), extra=["--dra-share", "intel=4"])
    claims: list[tuple[ClaimRef, dict]] = []
    try:
        await bench.published(plugin)
        bench.api.create({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                          "metadata": {"name": SHARED_CLASS}, "spec": {"selectors": [
                              {"cel": {"expression": f'device.driver == "{DRIVER}"'}},
                              {"cel": {"expression": "device.allowMultipleAllocations"}}]}})
        claims += [_share(bench, "first", 1), _share(bench, "second", 3)]
        assert len({result["device"] for _, result in claims}) == 1, "one port, two shares"
        for (ref, result), contexts in zip(claims, (1, 3), strict=True):
            outcome = await bench.dra.prepare([ref])
            assert outcome.ok, outcome.error
            ids = outcome.cdi_ids(ref.uid)
            specs = [json.loads(p.read_text()) for p in SPEC_DIR.glob("*.json")]
            nodes = {n["hostPath"] for s in specs for d in s["devices"]
                     for n in d["containerEdits"].get("deviceNodes", ())
                     if f"{s['kind']}={d['name']}" in ids}
            assert nodes == {str(host_node)}, nodes
            done = await asyncio.to_thread(
                run_in_container, podman, rootfs, ids, f"test -c {host_node} && echo "
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
