"""The DRA benchmarks' node: an emulated API server, an emulated kubelet, the real ``serve``.

As ``compat_tests/test_dra_serve.py`` runs it, with a real node's timings: an emulated 1.36
API server and kubelet (plugin watcher every second, health retried every 5 s, slice wipes
backing off from 1 s) in this process, ``serve --api dra`` (Intel backend on a fake node of
six ports, default log level: every claim logged, as on a real node) and the minimal
reference driver (:mod:`bench.reference_dra_driver`) as processes of their own, both
registered through the same plugins registry with the same kubelet and reading claims from the
same API server. As on a node, the claim checkpoint (``--dra-state-dir``, under
/var/lib/kubelet) is on disk and the CDI specs (``--cdi-spec-dir``, /var/run/cdi) on a tmpfs
(/dev/shm here), where an fsync costs nothing. The API server speaks HTTPS with a CA of its
own and a bearer token, both in the kubeconfig the drivers read, as a pod's service account
gives them (``ca.crt``, ``token``): so each driver's client trusts that one CA, not the
system's store, and pays for TLS on every request, as in a pod. Slices are followed through
the emulator's store: a watcher of its own on the node's ResourceSlices stamps each change
at the instant the store commits it.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import reference_dra_driver
from bench.serving import serve_command
from bench.serving import stop as _stop
from compat_tests.apiserver import ApiServerEmulator
from compat_tests.apiserver.client import ApiClient
from compat_tests.apiserver.store import Event, Watcher
from compat_tests.fake_sysfs import FakeNode
from compat_tests.kubelet import KubeletEmulator
from compat_tests.kubelet.dra import DraConfig
from compat_tests.kubelet.dra_results import ClaimRef

NODE = "node-a"
DRIVER = "accelerator.b-com.com"
REFERENCE = reference_dra_driver.DRIVER
NAMESPACE = "default"
MODEL = "1.36"
PATIENCE = 30.0

Names = frozenset[str]


@dataclass(eq=False)
class SliceTimeline(Watcher):
    """The device names in the node's slices after each change, stamped at commit time."""

    view: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def offer(self, event: Event) -> None:
        seen = self.translate(event)
        if seen is None:
            return
        kind, obj = seen
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            self.view.pop(name, None)
        else:
            self.view[name] = tuple(
                d["name"] for d in obj["spec"].get("devices", []) if not d.get("taints"))
        names = frozenset(n for devices in self.view.values() for n in devices)
        self.queue.put_nowait((time.perf_counter(), names))

    async def until(self, condition: Callable[[Names], bool], what: str) -> float:
        """The commit time of the first change, from now on, after which ``condition``
        holds of the untainted device names published for the node."""
        while True:
            try:
                stamp, names = await asyncio.wait_for(self.queue.get(), PATIENCE)
            except TimeoutError:
                raise TimeoutError(f"no {what} within {PATIENCE:g} s") from None
            if condition(names):
                return float(stamp)


def wiper(api: ApiServerEmulator) -> Any:
    """What a starting kubelet does to its node's slices (DeleteCollection by node)."""

    async def wipe(node: str) -> None:
        async with ApiClient(api.url, api.token, api.ca_file) as client:
            await client.delete("/apis/resource.k8s.io/v1/resourceslices",
                                fieldSelector=f"spec.nodeName={node}")

    return wipe


@dataclass
class DraWorld:
    root: Path
    api: ApiServerEmulator
    node: FakeNode
    config: DraConfig
    kubelet: KubeletEmulator
    serve: subprocess.Popen[bytes]
    reference: subprocess.Popen[bytes]
    timeline: SliceTimeline

    @property
    def registry(self) -> Path:
        return self.root / "registry"

    def published(self) -> Names:
        return frozenset(n for devices in self.timeline.view.values() for n in devices)

    def claim(self, name: str, driver: str, device: str) -> ClaimRef:
        obj = self.api.create_allocated_claim(NAMESPACE, name, driver=driver, pool=NODE,
                                              devices=[device], node_name=NODE)
        return ClaimRef(NAMESPACE, name, obj["metadata"]["uid"], (driver,))

    def new_kubelet(self) -> KubeletEmulator:
        return KubeletEmulator(self.root / "kubelet", MODEL, plugins_registry=self.registry,
                               dra=self.config)

    async def restart_kubelet(self) -> None:
        await self.kubelet.stop()
        self.kubelet = self.new_kubelet()
        await self.kubelet.start()

    async def registered(self) -> None:
        dra = self.kubelet.dra
        assert dra is not None
        await dra.wait_until(lambda: bool(dra.endpoints(DRIVER) and dra.endpoints(REFERENCE)),
                             PATIENCE, "both drivers registered")


def cdi_directory(root: Path) -> Path:
    """A fresh directory on a tmpfs, as /var/run/cdi is on a node; under ``root`` (with a
    warning on stderr) if this machine has no tmpfs at /dev/shm. The caller removes it."""
    mounts = Path("/proc/mounts").read_text().split("\n")
    if any(line.split()[1:3] == ["/dev/shm", "tmpfs"] for line in mounts if line):
        return Path(tempfile.mkdtemp(prefix="dpdra-cdi", dir="/dev/shm"))
    print("bench.dra: no tmpfs at /dev/shm; CDI specs on disk (fsyncs cost more than on a "
          "node)", file=sys.stderr)
    (root / "cdi").mkdir()
    return root / "cdi"


SERVE = ("-X", "importtime", "-m", "plugin")
"""How the benchmarks start ``serve``: imports logged (what it loaded is checked)."""
REFERENCE_DRIVER = ("-m", "bench.reference_dra_driver")


def dra_serve_command(root: Path, node: FakeNode, cdi: Path,
                      launcher: tuple[str, ...] = SERVE, flags: tuple[str, ...] = ()
                      ) -> list[str]:
    """``python LAUNCHER serve --api dra ... FLAGS`` on this world's directories."""
    command = serve_command(
        root / "kubelet", "--log-level", "info", "--api", "dra", "--node-name", NODE,
        "--kubeconfig", str(root / "kubeconfig"), "--plugins-registry-dir",
        str(root / "registry"), "--dra-state-dir", str(root / "state"), "--cdi-spec-dir",
        str(cdi), "--backend", "intel", "--sysfs-root", str(node.sysfs_root),
        "--dev-root", str(node.dev_root), *flags)
    assert command[1:3] == ["-m", "plugin"]
    return [command[0], *launcher, *command[3:]]


@contextlib.asynccontextmanager
async def dra_world(root: Path, node: FakeNode, devices: int, stderr: Path,
                    serve: tuple[str, ...] = SERVE,
                    reference: tuple[str, ...] = REFERENCE_DRIVER,
                    flags: tuple[str, ...] = ()):
    """The world above, with ``devices`` devices published and both drivers registered;
    ``serve`` started as ``python SERVE serve ... FLAGS`` (stderr in ``stderr``), the
    reference as ``python REFERENCE REGISTRY KUBECONFIG``."""
    async with contextlib.AsyncExitStack() as stack:
        cdi = cdi_directory(root)
        stack.callback(shutil.rmtree, cdi, True)
        api = await stack.enter_async_context(ApiServerEmulator(MODEL, tls=True))
        api.create_node(NODE)
        api.create_namespace(NAMESPACE)
        api.write_kubeconfig(root / "kubeconfig")
        timeline = SliceTimeline("resourceslices", None,
                                 lambda o: o["spec"].get("nodeName") == NODE)
        api.store.watchers.add(timeline)
        (root / "registry").mkdir()
        config = DraConfig(node_name=NODE, wipe_slices=wiper(api))
        kubelet = KubeletEmulator(root / "kubelet", MODEL, plugins_registry=root / "registry",
                                  dra=config)
        await kubelet.start()
        with open(stderr, "wb") as out:
            serving = subprocess.Popen(dra_serve_command(root, node, cdi, serve, flags),
                                       stdout=subprocess.DEVNULL, stderr=out)
        stack.callback(_stop, serving)
        referencing = subprocess.Popen(
            [sys.executable, *reference, str(root / "registry"), str(root / "kubeconfig")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        stack.callback(_stop, referencing)
        world = DraWorld(root, api, node, config, kubelet, serving, referencing, timeline)
        stack.push_async_callback(lambda: world.kubelet.stop())
        await timeline.until(lambda names: len(names) == devices, "every device published")
        await world.registered()
        yield world
