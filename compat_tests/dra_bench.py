"""One node of emulated Kubernetes for the DRA fault suites: a fake FPGA tree, an emulated
API server and 1.36 kubelet DRA manager over real sockets and HTTP, and ``serve`` processes.

Shared by every suite that turns a fault on against the real ``serve --api dra`` process
(``test_dra_faults``, ``test_dra_node_faults``, ``test_dra_claim_status``, ...); the
``dra_bench`` fixture in ``compat_tests/conftest.py`` builds and tears one down per test.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from compat_tests.apiserver import ApiServerEmulator
from compat_tests.apiserver.client import ApiClient
from compat_tests.conftest import FAST_DRA
from compat_tests.dra_support import until
from compat_tests.fake_sysfs import FakeNode
from compat_tests.kubelet import KubeletEmulator
from compat_tests.kubelet.dra import DraConfig
from compat_tests.kubelet.dra_results import ClaimRef, DeviceHealthRecord
from compat_tests.plugin_process import PluginProcess

NODE = "node-a"
DRIVER = "accelerator.b-com.com"
NAMESPACE = "default"
SETTLE = 15.0
"""Guards against hangs on a loaded 2-core machine; not a performance target."""
V1BETA1_ONLY = "resource.k8s.io/v1beta1=true"
BACKOFF_SEEN = 3.5
"""Longest pause a retry loop can be in after ~3 s of failures (0.2 s doubling)."""
WIPES = 3
"""Wipes :meth:`Bench.wipe_is_undone` may make before one is seen by the slice watch: a wipe
that races the watch being made anew is undone by the list before it, unseen."""
DELETION_SEEN = "was deleted (kubelet start?); publishing again"
"""What the driver says when its slice watch sees one of its slices deleted."""
WRITES = ("create", "update", "patch", "delete", "deletecollection")


def messages(plugin: PluginProcess, *levels: str) -> list[str]:
    return [e.get("message", "") for e in plugin.entries()
            if not levels or e.get("level") in levels]


class Bench:
    """One node: a fake sysfs tree, an emulated API server and kubelet, serve processes."""

    def __init__(self, tmp: Path, sockdir: Path, logdir: Path) -> None:
        self.tmp = tmp
        self.sockdir = sockdir
        self.logdir = logdir
        self.fake = FakeNode(tmp / "node")
        self.ports = {bus: self.fake.add_dfl_card(f"0000:{bus}:00.0", ports=2)
                      for bus in ("3b", "5e", "86", "af")}
        self.registry = sockdir / "registry"
        self.registry.mkdir()
        self.cdi = tmp / "cdi"
        self.state = sockdir / "state"
        self._api: ApiServerEmulator | None = None
        self._kubelet: KubeletEmulator | None = None
        self.plugins: list[PluginProcess] = []

    # -- parts ----------------------------------------------------------------------------

    @property
    def api(self) -> ApiServerEmulator:
        assert self._api is not None, "no API server started"
        return self._api

    @property
    def kubelet(self) -> KubeletEmulator:
        assert self._kubelet is not None, "no kubelet started"
        return self._kubelet

    @property
    def dra(self) -> Any:
        assert self.kubelet.dra is not None
        return self.kubelet.dra

    async def start_api(self, model: str = "1.36", **options: Any) -> ApiServerEmulator:
        self._api = await ApiServerEmulator(model, **options).start()
        self._api.create_node(NODE)
        self._api.create_namespace(NAMESPACE)
        return self._api

    def kubeconfig(self, **user: Any) -> Path:
        """A kubeconfig for the API server; ``user`` replaces its user entry (``tokenFile``)."""
        config = self.api.kubeconfig()
        if user:
            config["users"][0]["user"] = user
        path = self.tmp / "kubeconfig"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    async def start_kubelet(self, model: str = "1.36") -> KubeletEmulator:
        config = DraConfig(**FAST_DRA, node_name=NODE, wipe_slices=self._wiper())
        self._kubelet = KubeletEmulator(self.sockdir, model, plugins_registry=self.registry,
                                        reconcile_period=0.05, dra=config)
        await self._kubelet.start()
        return self._kubelet

    def _wiper(self) -> Any:
        """What a starting kubelet does to its node's slices, in the version served now."""

        async def wipe(node: str) -> None:
            api = self.api
            async with ApiClient(api.url, api.token, api.ca_file) as client:
                await client.delete(
                    f"/apis/resource.k8s.io/{api.model.preferred_version}/resourceslices",
                    fieldSelector=f"spec.nodeName={node}")

        return wipe

    def serve(self, kubeconfig: Path | None = None, *, name: str = "plugin",
              extra: Sequence[str] = ()) -> PluginProcess:
        # --events off: these cases count the driver's requests and warnings; the Events'
        # own requests meet the same faults in test_events_serve.py.
        flags = ["--api", "dra", "--node-name", NODE, "--events", "off",
                 "--plugins-registry-dir", str(self.registry), "--dra-state-dir",
                 str(self.state), "--cdi-spec-dir", str(self.cdi), "--backend", "intel",
                 "--sysfs-root", str(self.fake.sysfs_root), "--dev-root",
                 str(self.fake.dev_root), "--health-interval", "0.2", *extra]
        if kubeconfig is not None:
            flags += ["--kubeconfig", str(kubeconfig)]
        plugin = PluginProcess(self.sockdir, self.logdir, name=name, extra=flags).start()
        self.plugins.append(plugin)
        return plugin

    async def up(self, model: str = "1.36", **api_options: Any) -> PluginProcess:
        """API server, kubelet and one serve, with every port published and registered."""
        await self.start_api(model, **api_options)
        await self.start_kubelet()
        plugin = self.serve(self.kubeconfig())
        await self.published(plugin)
        return plugin

    async def published(self, plugin: PluginProcess, count: int = 8) -> None:
        await self.until_alive(plugin, lambda: len(self.device_names()) == count,
                               f"{count} ports published")
        await self.until_alive(plugin, lambda: self.dra.endpoints(DRIVER), "driver registered")

    async def until_alive(self, plugin: PluginProcess, condition: Callable[[], Any],
                          what: str, timeout: float = SETTLE) -> float:
        def holds() -> Any:
            assert plugin.alive, f"serve died before {what}:\n{plugin.text()}"
            return condition()

        try:
            return await until(holds, what, timeout)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nplugin log:\n{plugin.text()[-6000:]}") from None

    async def wipe_is_undone(self, plugin: PluginProcess) -> None:
        """What a kubelet start does to the slices, undone by the driver's slice watch: the
        watch open on the server sees the deletions (the driver says so) and every slice is
        back. Not by a list after the watch broke, which would also bring them back, later:
        that is what the driver saying it saw them deleted tells apart, with no stopwatch.
        How soon is bench/dra.py's ("kubelet start wipe -> all back")."""
        for _ in range(WIPES):
            await self.watch_is_back(plugin)
            seen = len(self.deletions_seen(plugin))
            await self._wiper()(NODE)
            await self.until_alive(plugin, lambda: len(self.device_names()) == 8,
                                   "slices back after a wipe")
            if len(self.deletions_seen(plugin)) > seen:
                return
        raise AssertionError(f"{WIPES} wipes undone, none seen by the slice watch:\n"
                             f"{plugin.text()[-6000:]}")

    @staticmethod
    def deletions_seen(plugin: PluginProcess) -> list[str]:
        return [m for m in messages(plugin) if DELETION_SEEN in m]

    async def watch_is_back(self, plugin: PluginProcess) -> None:
        """After a fault, the driver's slice watch is open on the server again: at once if
        the fault left it alone, after its back-off if it broke the watch."""
        await self.until_alive(
            plugin, lambda: any(w.resource == "resourceslices" for w in self.api.store.watchers),
            "the slice watch open again")

    async def close(self) -> None:
        for plugin in self.plugins:
            plugin.kill()
        if self._kubelet is not None:
            await self._kubelet.stop()
        if self._api is not None:
            await self._api.stop()

    # -- what the cluster sees -------------------------------------------------------------

    def slices(self) -> list[dict[str, Any]]:
        return [s for s in self.api.list("resourceslices") if s["spec"]["nodeName"] == NODE]

    def devices(self) -> dict[str, dict[str, Any]]:
        return {d["name"]: d for s in self.slices() for d in s["spec"].get("devices", [])}

    def device_names(self) -> list[str]:
        return sorted(self.devices())

    def tainted(self, name: str) -> bool:
        device = self.devices().get(name)
        return device is not None and bool(device.get("taints"))

    def untainted(self, name: str) -> bool:
        device = self.devices().get(name)
        return device is not None and not device.get("taints")

    def health(self) -> dict[str, DeviceHealthRecord]:
        """The driver's devices in the kubelet's latest health message."""
        updates = [u for u in self.dra.health_updates if u.driver == DRIVER]
        return {d.device_name: d for d in updates[-1].devices} if updates else {}

    def health_of(self, name: str) -> str | None:
        record = self.health().get(name)
        return None if record is None else record.health

    def claim(self, name: str, devices: list[str]) -> ClaimRef:
        obj = self.api.create_allocated_claim(NAMESPACE, name, driver=DRIVER, pool=NODE,
                                              devices=devices, node_name=NODE)
        return ClaimRef(NAMESPACE, name, obj["metadata"]["uid"], (DRIVER,))

    def slice_writes(self, since: float = 0.0) -> list[Any]:
        return [r for r in self.api.requests if r.resource == "resourceslices"
                and r.verb in WRITES and r.time >= since]

    def requests(self, since: float, resource: str | None = None) -> list[Any]:
        return [r for r in self.api.requests if r.time >= since
                and resource in (None, r.resource)]


def port_device(bench: Bench, bus: str, index: int = 0) -> tuple[str, str]:
    """(port name in the fake tree, DRA device name) of a card's port."""
    port = bench.ports[bus][index]
    return port, f"pci-0000-{bus}-00-0" + (f"-port{index}" if index else "")
