"""DRA faults a real cluster throws, against the real ``serve --api dra`` process.

Between an emulated API server (``compat_tests/apiserver``) and an emulated 1.36 kubelet DRA
manager, over real sockets and real HTTP, as ``test_dra_serve`` sets them up; each case turns
one fault on and asserts what a cluster would see: the slices converge, the kubelet's health
stream and prepare calls keep answering, requests stay bounded while the fault lasts, the
fault is logged once, and the process never has to be restarted to recover.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
import textwrap
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from compat_tests.apiserver import DEFAULT_USER, ApiServerEmulator
from compat_tests.apiserver.client import ApiClient
from compat_tests.conftest import FAST_DRA
from compat_tests.dra_support import recorded_claims, until
from compat_tests.fake_sysfs import CRASHED_AFU_ID, DEFAULT_AFU_ID, FakeNode
from compat_tests.kubelet import KubeletEmulator
from compat_tests.kubelet.dra import DraConfig
from compat_tests.kubelet.dra_results import ClaimRef, DeviceHealthRecord
from compat_tests.plugin_process import PluginProcess, run_at_start_up
from compat_tests.test_faults_discovery import HANGING_READS
from plugin.serving.dra.driver import CHECKPOINT_FILE

NODE = "node-a"
DRIVER = "accelerator.b-com.com"
NAMESPACE = "default"
SETTLE = 15.0
"""Guards against hangs on a loaded 2-core machine; not a performance target."""
V1BETA1_ONLY = "resource.k8s.io/v1beta1=true"
BACKOFF_SEEN = 3.5
"""Longest pause a retry loop can be in after ~3 s of failures (0.2 s doubling)."""
WIPE_UNDONE = 1.0
"""How soon the slice watch puts back what a kubelet's start wiped."""
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

    async def wipe_is_undone(self, plugin: PluginProcess, within: float = WIPE_UNDONE) -> None:
        """What a kubelet start does to the slices, undone by the driver's slice watch."""
        await self._wiper()(NODE)
        back = await self.until_alive(plugin, lambda: len(self.device_names()) == 8,
                                      "slices back after a wipe")
        assert back < within, f"slices back after {back:.2f} s, not within {within} s"

    async def watch_is_back(self, plugin: PluginProcess) -> None:
        """After a fault, the driver's slice watch is open on the server again: at once if
        the fault left it alone, after its back-off if it broke the watch. The watch has
        BACKOFF_SEEN and the one second a wipe may take to be undone, as long as when the
        test slept BACKOFF_SEEN before wiping."""
        await self.until_alive(
            plugin, lambda: any(w.resource == "resourceslices" for w in self.api.store.watchers),
            "the slice watch open again", timeout=BACKOFF_SEEN + WIPE_UNDONE)

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


@pytest.fixture
def bench(dra_bench: Bench) -> Bench:
    """One node of emulated Kubernetes and a fake FPGA tree (compat_tests/conftest.py)."""
    return dra_bench


def port_device(bench: Bench, bus: str, index: int = 0) -> tuple[str, str]:
    """(port name in the fake tree, DRA device name) of a card's port."""
    port = bench.ports[bus][index]
    return port, f"pci-0000-{bus}-00-0" + (f"-port{index}" if index else "")


# -- 1. credentials that rotate -------------------------------------------------------------


def write_token(path: Path, token: str) -> None:
    """As the kubelet rotates a projected token: a new file renamed over the old one."""
    spare = path.with_name(path.name + ".new")
    spare.write_text(token + "\n")
    spare.replace(path)


async def rotate_and_check(bench: Bench, plugin: PluginProcess, token_file: Path) -> None:
    """Rotate twice (file first, then server first with a gap); publishing, the slice watch
    and claim reads go on each time without a restart."""
    for round_, server_first in ((1, False), (2, True)):
        token = f"rotated-{round_}"
        if server_first:  # the old token dies before the new file lands
            bench.api.set_tokens({token: DEFAULT_USER})
            await asyncio.sleep(0.5)
            write_token(token_file, token)
        else:
            write_token(token_file, token)
            bench.api.set_tokens({token: DEFAULT_USER})
        port, name = port_device(bench, "5e", round_ - 1)
        bench.fake.set_afu_id(port, CRASHED_AFU_ID)
        await bench.until_alive(plugin, lambda name=name: bench.tainted(name),
                                f"round {round_}: crash published with the new token")
        claim = bench.claim(f"after-rotation-{round_}", [bench.device_names()[0]])
        outcome = await bench.dra.prepare([claim])
        assert outcome.ok, outcome.error
        bench.api.end_watches()  # the slice watch connects again, with the new token
        await asyncio.sleep(0.5)
        await bench.wipe_is_undone(plugin)
    assert plugin.alive


async def test_a_rotated_token_file_is_read_again_without_a_restart(bench):
    await bench.start_api(tokens={"first": DEFAULT_USER})
    await bench.start_kubelet()
    token_file = bench.tmp / "token"
    write_token(token_file, "first")
    plugin = bench.serve(bench.kubeconfig(tokenFile=str(token_file)))
    await bench.published(plugin)
    await rotate_and_check(bench, plugin, token_file)


SERVICE_ACCOUNT_AT = textwrap.dedent('''
    """Test-only: the pod's service account directory is where the test made one."""
    import os

    from lightkube import KubeConfig

    KubeConfig.from_service_account.__func__.__defaults__ = (
        os.environ["DP_TEST_SERVICE_ACCOUNT"],)
''')


async def test_the_in_pod_service_account_token_is_read_again_when_rotated(
        bench, monkeypatch):
    """``KubeConfig.from_service_account`` takes the directory as an argument; the serve
    process uses the default, so a start-up hook points the default at a temporary one."""
    api = await bench.start_api(tls=True, tokens={"first": DEFAULT_USER})
    await bench.start_kubelet()
    account = bench.tmp / "serviceaccount"
    account.mkdir()
    assert api.ca_file is not None
    shutil.copy(api.ca_file, account / "ca.crt")
    (account / "namespace").write_text("kube-system")
    token_file = account / "token"
    write_token(token_file, "first")
    run_at_start_up(SERVICE_ACCOUNT_AT, bench.tmp / "inject", monkeypatch)
    monkeypatch.setenv("DP_TEST_SERVICE_ACCOUNT", str(account))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(api.port))
    plugin = bench.serve(None)
    await bench.published(plugin)
    await rotate_and_check(bench, plugin, token_file)


async def test_a_service_account_not_there_yet_is_said_once_and_waited_for(
        bench, monkeypatch):
    api = await bench.start_api(tls=True, tokens={"first": DEFAULT_USER})
    await bench.start_kubelet()
    account = bench.tmp / "serviceaccount"
    account.mkdir()
    run_at_start_up(SERVICE_ACCOUNT_AT, bench.tmp / "inject", monkeypatch)
    monkeypatch.setenv("DP_TEST_SERVICE_ACCOUNT", str(account))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(api.port))
    plugin = bench.serve(None)
    await plugin.wait_for_log(lambda e: "service account" in e.get("message", ""),
                              what="the missing service account said")
    await asyncio.sleep(3.0)
    said = messages(plugin, "error")
    assert len(said) == 1 and "token" in said[0], said
    assert api.ca_file is not None
    shutil.copy(api.ca_file, account / "ca.crt")
    (account / "namespace").write_text("kube-system")
    write_token(account / "token", "first")
    await bench.published(plugin)


async def test_a_relative_token_file_is_found_beside_the_kubeconfig(bench):
    """kubectl and client-go resolve a relative ``tokenFile`` against the kubeconfig's own
    directory, not the process's working directory."""
    await bench.start_api(tokens={"first": DEFAULT_USER})
    await bench.start_kubelet()
    write_token(bench.tmp / "token", "first")
    plugin = bench.serve(bench.kubeconfig(tokenFile="token"))
    await bench.published(plugin)


# -- 2. 409 on update, 410 on the watch -----------------------------------------------------


SHORT_WATCHES = textwrap.dedent('''
    """Test-only: slice watches are made anew every 2 s instead of every 5 minutes."""
    import plugin.serving.dra.publisher as publisher

    publisher.WATCH_LIFETIME = 2.0
''')


async def test_a_watch_on_a_dead_connection_is_given_up_and_made_anew(bench, monkeypatch):
    """The server stops sending on the watch without closing it (a load balancer failing
    over, a peer gone without a reset): no event ever comes, yet none is an error."""
    run_at_start_up(SHORT_WATCHES, bench.tmp / "inject", monkeypatch)
    plugin = await bench.up()
    for watcher in list(bench.api.store.watchers):
        bench.api.store.unwatch(watcher)  # the streams stay open and say nothing more
    await bench.wipe_is_undone(plugin, within=2.0 + 1.0)


async def test_conflicts_on_slice_updates_back_off_and_converge(bench):
    plugin = await bench.up()
    port, name = port_device(bench, "86")
    bench.api.conflict_next(1000)  # another writer that never stops
    start = time.time()
    bench.fake.set_afu_id(port, CRASHED_AFU_ID)
    await asyncio.sleep(3.0)
    updates = [r for r in bench.slice_writes(start) if r.verb == "update"]
    assert 1 <= len(updates) <= 15, f"{len(updates)} updates in 3 s against conflicts"
    assert all(r.status == 409 for r in updates)
    # Not the start-up line: it echoes the settings, whose paths hold this test's name.
    said = [m for m in messages(plugin)
            if ("409" in m or "onflict" in m) and not m.startswith("starting:")]
    assert len(said) == 1, said
    bench.api.registry.conflicts_pending = 0
    await bench.until_alive(plugin, lambda: bench.tainted(name), "crash published after")
    await bench.wipe_is_undone(plugin)


async def test_a_few_conflicts_are_retried_at_once(bench):
    plugin = await bench.up()
    port, name = port_device(bench, "86")
    bench.api.conflict_next(1)
    bench.fake.set_afu_id(port, CRASHED_AFU_ID)
    took = await bench.until_alive(plugin, lambda: bench.tainted(name), "crash published")
    assert took < 1.0


async def test_an_expired_watch_lists_again_and_keeps_following(bench):
    plugin = await bench.up()
    start = time.time()
    bench.api.expire_resource_versions()
    assert bench.api.end_watches() >= 1
    await asyncio.sleep(1.0)
    await bench.wipe_is_undone(plugin)
    watches = bench.api.find_requests(verb="watch", resource="resourceslices")
    assert len([w for w in watches if w.time >= start]) <= 4, watches
    assert not [m for m in messages(plugin, "warning", "error") if "410" in m]


async def test_a_watch_that_always_answers_410_is_not_a_hot_loop(bench):
    plugin = await bench.up()
    start = time.time()
    bench.api.faults.fail_next(10_000, 410, verb="watch", resource="resourceslices")
    bench.api.end_watches()
    await asyncio.sleep(3.0)
    asked = bench.requests(start, "resourceslices")
    assert len(asked) <= 40, f"{len(asked)} slice requests in 3 s"
    said = [m for m in messages(plugin) if "410" in m]
    assert len(said) == 1, said
    bench.api.faults.clear()
    bench.fake.set_afu_id(port_device(bench, "af")[0], CRASHED_AFU_ID)
    await bench.until_alive(plugin, lambda: bench.tainted(port_device(bench, "af")[1]),
                            "crash published after")
    await bench.watch_is_back(plugin)  # the watch's next try, after its back-off
    await bench.wipe_is_undone(plugin)


async def test_watches_the_server_ends_at_once_are_backed_off_not_a_hot_loop(bench):
    """A proxy whose timeout is shorter than any watch ends every watch cleanly right away.
    Relisting and watching again at once would be a loop of lists; client-go counts a watch
    that ends within a second without an event as a failure and backs off."""
    plugin = await bench.up()
    start = time.time()
    bench.api.faults.end_watches_at_once = True
    bench.api.end_watches()
    await asyncio.sleep(3.0)
    asked = bench.requests(start, "resourceslices")
    assert len(asked) <= 20, f"{len(asked)} slice requests in 3 s"
    said = [m for m in messages(plugin, "warning") if "ends watches at once" in m]
    assert len(said) == 1, messages(plugin, "warning", "error")
    bench.api.faults.end_watches_at_once = False
    await asyncio.sleep(BACKOFF_SEEN)  # the watch's next try, after its back-off
    await bench.wipe_is_undone(plugin)


# -- 3. RBAC missing, then granted ----------------------------------------------------------


async def test_missing_rbac_on_slices_is_said_once_and_recovers_without_restart(bench):
    await bench.start_api()
    await bench.start_kubelet()
    bench.api.faults.deny("create", "resourceslices")
    plugin = bench.serve(bench.kubeconfig())
    await plugin.wait_for_log(lambda e: e.get("level") == "error"
                              and "resourceslices" in e.get("message", ""),
                              what="the refusal logged")
    await bench.until_alive(plugin, lambda: bench.dra.endpoints(DRIVER),
                            "registered with the kubelet meanwhile")
    await asyncio.sleep(3.0)
    said = [m for m in messages(plugin) if "resourceslices" in m]
    assert len(said) == 1, said
    assert 'cannot create resource "resourceslices"' in said[0], said
    assert not bench.slices()
    bench.api.faults.allow("create", "resourceslices")
    await bench.published(plugin)
    await plugin.wait_for_log(lambda e: "answers again" in e.get("message", ""),
                              what="the recovery said")


async def test_missing_rbac_on_claims_is_a_per_claim_error_naming_it(bench):
    plugin = await bench.up()
    claim = bench.claim("refused", [bench.device_names()[0]])
    bench.api.faults.deny("get", "resourceclaims")
    outcome = await bench.dra.prepare([claim])
    result = outcome.result(claim.uid)
    assert result.answered and not result.ok
    assert "get on resourceclaims" in result.error, result.error
    assert "403" in result.error, result.error
    bench.api.faults.allow("get", "resourceclaims")
    assert (await bench.dra.prepare([claim])).ok
    assert plugin.alive


# -- 4. errors, overload and a slow server --------------------------------------------------


@pytest.mark.parametrize("status", [500, 503, 429])
async def test_a_burst_of_server_errors_is_backed_off_and_recovered(bench, status):
    plugin = await bench.up()
    port, name = port_device(bench, "3b", 1)
    start = time.time()
    bench.api.faults.fail_next(10_000, status, retry_after=2)
    bench.fake.set_afu_id(port, CRASHED_AFU_ID)
    await asyncio.sleep(3.0)
    asked = bench.requests(start)
    assert len(asked) <= 12, [(r.verb, r.resource, r.status) for r in asked]  # 0.2 s doubling
    if status == 429:  # priority and fairness said when to come back
        gaps = [round(b.time - a.time, 2) for a, b in itertools.pairwise(asked)]
        assert all(gap >= 1.9 for gap in gaps), f"Retry-After 2 s, tries {gaps} s apart"
    said = [m for m in messages(plugin) if str(status) in m]
    assert len(said) == 1, said
    bench.api.faults.clear()
    await bench.until_alive(plugin, lambda: bench.tainted(name), "crash published after")
    await bench.watch_is_back(plugin)
    await bench.wipe_is_undone(plugin)


async def test_one_outage_is_said_once_whatever_its_wording(bench):
    """The failures of one outage differ in their words (an etcd leader change, then a
    timeout; a refused connection, then a connect timeout): still one warning."""
    plugin = await bench.up()
    port, name = port_device(bench, "3b", 1)
    bench.api.faults.fail_next(1, 503, message="etcdserver: leader changed")
    bench.api.faults.fail_next(1, 503, message="etcdserver: request timed out")
    bench.api.faults.fail_next(1, 500, message="etcdserver: request timed out")
    bench.fake.set_afu_id(port, CRASHED_AFU_ID)
    await bench.until_alive(plugin, lambda: bench.tainted(name), "crash published after")
    await plugin.wait_for_log(lambda e: "answers again" in e.get("message", ""),
                              what="the recovery said")
    said = [m for m in messages(plugin) if "cannot publish" in m]
    assert len(said) == 2, said  # 503 and 500: two kinds of failure, each said once


CLIENT_TIMEOUT = 3.0
"""``--api-request-timeout`` of the slow-server case (10 s by default): what is asserted is
the same whatever its value, only the wait is shorter."""


async def test_a_server_slower_than_the_client_timeout(bench):
    await bench.start_api()
    await bench.start_kubelet()
    plugin = bench.serve(bench.kubeconfig(),
                         extra=["--api-request-timeout", str(CLIENT_TIMEOUT)])
    await bench.published(plugin)
    claim = bench.claim("slow", [bench.device_names()[0]])
    port, name = port_device(bench, "86", 1)
    start = time.time()
    bench.api.faults.delay = CLIENT_TIMEOUT + 2.0  # every call outlasts the driver's timeout
    bench.fake.set_afu_id(port, CRASHED_AFU_ID)
    outcome = await bench.dra.prepare([claim])
    took = time.time() - start
    result = outcome.result(claim.uid)
    assert result.answered and not result.ok
    assert "API server" in result.error, result.error
    assert took < CLIENT_TIMEOUT + 5.0, f"prepare answered after {took:.1f} s"
    asked = bench.requests(start)
    assert len(asked) <= 8, [(r.verb, r.resource) for r in asked]
    bench.api.faults.delay = 0.0
    await bench.until_alive(plugin, lambda: bench.tainted(name), "crash published after",
                            timeout=25.0)
    assert (await bench.dra.prepare([claim])).ok


# -- 5. the API server upgraded (or downgraded) behind the same address ---------------------


def writes_through(bench: Bench, version: str, since: float) -> bool:
    return any(r.version == version and r.status in (200, 201)
               for r in bench.slice_writes(since))


async def test_an_upgrade_from_1_33_to_1_36_moves_slices_and_claims_to_v1(bench):
    plugin = await bench.up("1.33", runtime_config=V1BETA1_ONLY)
    assert {r.version for r in bench.slice_writes()} == {"v1beta1"}
    crashed_port, crashed = port_device(bench, "af", 1)
    bench.fake.set_afu_id(crashed_port, CRASHED_AFU_ID)
    # 1.33 has DRADeviceTaints off: the taint is dropped, so the device is left out.
    await bench.until_alive(plugin, lambda: crashed not in bench.devices(),
                            "crashed port left out on a server without taints")
    start = time.time()
    await bench.api.restart("1.36")
    claim = bench.claim("after-upgrade", [bench.device_names()[0]])
    outcome = await bench.dra.prepare([claim])  # at once: before anything else noticed
    assert outcome.ok, outcome.error
    # Reads only: the claim's status write (a PATCH, after the answer) may come meanwhile.
    reads = [r.version for r in bench.requests(start, "resourceclaims")
             if r.status == 200 and r.verb == "get"]
    assert reads == ["v1"], reads
    took = await bench.until_alive(plugin, lambda: writes_through(bench, "v1", start),
                                   "slices written through v1")
    assert took < 5.0
    # 1.36 keeps taints: the crashed port is back, tainted, with the others.
    await bench.until_alive(plugin, lambda: bench.tainted(crashed),
                            "crashed port published tainted after the upgrade")
    assert len(bench.device_names()) == 8
    await bench.wipe_is_undone(plugin)


async def test_a_downgrade_from_1_36_to_1_33_moves_slices_and_claims_to_v1beta1(bench):
    plugin = await bench.up("1.36")
    crashed_port, crashed = port_device(bench, "af", 1)
    bench.fake.set_afu_id(crashed_port, CRASHED_AFU_ID)
    await bench.until_alive(plugin, lambda: bench.tainted(crashed), "crash published")
    start = time.time()
    await bench.api.restart("1.33", runtime_config=V1BETA1_ONLY)
    claim = bench.claim("after-downgrade", [bench.device_names()[0]])
    outcome = await bench.dra.prepare([claim])
    assert outcome.ok, outcome.error
    # Reads only: the claim's status write (a PATCH, after the answer) may come meanwhile.
    reads = [r.version for r in bench.requests(start, "resourceclaims")
             if r.status == 200 and r.verb == "get"]
    assert reads == ["v1beta1"], reads
    took = await bench.until_alive(plugin, lambda: writes_through(bench, "v1beta1", start),
                                   "slices written through v1beta1")
    assert took < 5.0
    # Never published untainted: tainted (a slice using taints keeps them on a server with
    # the gate off: ratcheting), or left out where the server drops them.
    await asyncio.sleep(1.0)
    assert not bench.untainted(crashed), bench.devices().get(crashed)
    bench.fake.set_afu_id(crashed_port, DEFAULT_AFU_ID)
    await bench.until_alive(plugin, lambda: bench.untainted(crashed),
                            "recovery published through v1beta1")
    await bench.wipe_is_undone(plugin)


# -- 6. hot-plug and health, to the slices and to the kubelet's health stream ---------------


HEALTH_FAULTS = {
    "AFU crash": (lambda n, p: n.set_afu_id(p, CRASHED_AFU_ID),
                  lambda n, p: n.set_afu_id(p, DEFAULT_AFU_ID)),
    "port error": (lambda n, p: n.set_port_error(p, 0x1),
                   lambda n, p: n.set_port_error(p, 0)),
    "device node deleted": (lambda n, p: n.delete_device_node(p),
                            lambda n, p: n.restore_device_node(p)),
}


async def both_within(bench: Bench, plugin: PluginProcess, what: str, limit: float,
                      in_slices: Callable[[], bool], in_health: Callable[[], bool]) -> None:
    """The slices and the kubelet's health stream both show it within ``limit`` seconds."""
    took = await asyncio.gather(
        bench.until_alive(plugin, in_slices, f"{what} in the slices"),
        bench.until_alive(plugin, in_health, f"{what} in the kubelet's health stream"))
    assert max(took) < limit, f"{what}: slices after {took[0]:.2f} s, health after " \
                              f"{took[1]:.2f} s"


@pytest.mark.parametrize("fault", list(HEALTH_FAULTS))
async def test_a_health_change_reaches_slices_and_health_stream_within_a_second(bench, fault):
    plugin = await bench.up()
    break_it, mend_it = HEALTH_FAULTS[fault]
    port, name = port_device(bench, "5e", 1)
    await bench.until_alive(plugin, lambda: bench.health_of(name) == "Healthy", "healthy")
    break_it(bench.fake, port)
    await both_within(bench, plugin, f"{fault} of {name}", 1.0,
                      lambda: bench.tainted(name),
                      lambda: bench.health_of(name) == "Unhealthy")
    assert bench.health()[name].message, "the kubelet is told why"
    assert all(bench.health_of(n) == "Healthy" for n in bench.device_names() if n != name)
    mend_it(bench.fake, port)
    await both_within(bench, plugin, f"{name} mended", 1.0,
                      lambda: bench.untainted(name),
                      lambda: bench.health_of(name) == "Healthy")


async def test_a_port_plugged_in_and_removed_reaches_slices_and_health_within_a_second(bench):
    plugin = await bench.up()
    before = set(bench.device_names())
    port = bench.fake.add_port("0000:3b:00.0")
    await both_within(bench, plugin, "new port", 1.0,
                      lambda: len(bench.device_names()) == 9,
                      lambda: len(bench.health()) == 9)
    [added] = set(bench.device_names()) - before
    assert bench.untainted(added) and bench.health_of(added) == "Healthy"
    gone_port, gone = port_device(bench, "86", 1)
    bench.fake.remove_port(gone_port)
    bench.fake.remove_port(port)
    await both_within(bench, plugin, "two ports removed", 1.0,
                      lambda: set(bench.device_names()) == before - {gone},
                      lambda: set(bench.health()) == before - {gone})


# -- 7. discovery stalled -------------------------------------------------------------------


STALL_TIMEOUT = 1.0


async def test_a_stalled_discovery_is_never_healthy_to_the_kubelet_nor_the_scheduler(
        bench, monkeypatch):
    run_at_start_up(HANGING_READS, bench.tmp / "inject", monkeypatch)
    marker = bench.tmp / "hang"
    monkeypatch.setenv("DP_TEST_HANG_MARKER", str(marker))
    await bench.start_api()
    await bench.start_kubelet()
    plugin = bench.serve(bench.kubeconfig(), extra=[
        "--scan-stall-timeout", str(STALL_TIMEOUT), "--rescan-interval", "0.5"])
    await bench.published(plugin)
    names = bench.device_names()
    await bench.until_alive(plugin, lambda: all(bench.health_of(n) == "Healthy" for n in names),
                            "all healthy")
    marker.touch()  # every afu_id read hangs from now on
    await both_within(
        bench, plugin, "stall", STALL_TIMEOUT + 1.0,
        lambda: all(bench.tainted(n) for n in names),
        lambda: all(bench.health_of(n) in ("Unknown", "Unhealthy") for n in names))
    assert {bench.health_of(n) for n in names} == {"Unknown"}, "not known is Unknown"
    assert all("stalled" in (bench.health()[n].message or "") for n in names)
    marker.unlink()
    await both_within(bench, plugin, "discovery answering again", SETTLE,
                      lambda: all(bench.untainted(n) for n in names),
                      lambda: all(bench.health_of(n) == "Healthy" for n in names))


# -- 8. a corrupt checkpoint ----------------------------------------------------------------


@pytest.mark.parametrize("content", [b"{\"kind\": \"AcceleratorDraClaim", b"\x00" * 64, b""])
async def test_a_corrupt_checkpoint_is_set_aside_once_and_serving_goes_on(bench, content):
    await bench.start_api()
    await bench.start_kubelet()
    bench.state.mkdir()
    checkpoint = bench.state / CHECKPOINT_FILE
    checkpoint.write_bytes(content)
    plugin = bench.serve(bench.kubeconfig())
    await bench.published(plugin)
    said = [m for m in messages(plugin, "error") if "checkpoint" in m]
    assert len(said) == 1 and "unusable" in said[0], said
    [aside] = bench.state.glob(f"{CHECKPOINT_FILE}.corrupt-*")
    assert aside.read_bytes() == content, "kept for a person to read"
    claim = bench.claim("after-corruption", bench.device_names()[:2])
    outcome = await bench.dra.prepare([claim])
    assert outcome.ok, outcome.error
    assert claim.uid in recorded_claims(bench.state)
    assert (await bench.dra.unprepare([claim])).ok
    assert len([m for m in messages(plugin, "error") if "checkpoint" in m]) == 1


@pytest.mark.parametrize("tear", ["cut short", "zeros"])
async def test_a_checkpoint_torn_by_a_power_cut_keeps_what_came_before(bench, tear):
    """Without fsync a power cut can cut the journal's last line short or leave zeros in
    its place. The claims recorded before it are still prepared (unprepare finds them and
    removes their specs); the torn change is lost, said once as a warning, and the file is
    whole again after the next change."""
    plugin = await bench.up()
    kept, lost = bench.claim("kept", bench.device_names()[:1]), bench.claim(
        "lost", bench.device_names()[1:2])
    assert (await bench.dra.prepare([kept])).ok
    checkpoint = bench.state / CHECKPOINT_FILE
    before = checkpoint.read_bytes()
    assert (await bench.dra.prepare([lost])).ok
    added = checkpoint.read_bytes()[len(before):]
    assert await plugin.terminate() == 0  # the node lost power; this driver left first
    checkpoint.write_bytes(before + (added[: len(added) // 2] if tear == "cut short"
                                     else b"\0" * len(added)))

    restarted = bench.serve(bench.kubeconfig(), name="restarted")
    await bench.until_alive(restarted, lambda: bench.dra.endpoints(DRIVER), "registered again")
    kept_spec = bench.cdi / recorded_claims(bench.state)[kept.uid].claim_spec
    assert kept_spec.exists()
    assert (await bench.dra.unprepare([kept, lost])).ok
    assert not kept_spec.exists(), "a claim recorded before the tear is still unprepared"
    assert not list(bench.cdi.glob(f"*{lost.uid}*")), "the lost claim's spec goes by its UID"
    warned = [m for m in messages(restarted, "warning") if "damaged line" in m]
    assert len(warned) == 1, messages(restarted, "warning", "error")
    assert not [m for m in messages(restarted, "error") if "checkpoint" in m]
    assert kept.uid not in recorded_claims(bench.state), "the file reads whole again"


# -- 9. a second instance on the node (rolling update) --------------------------------------


async def test_a_second_instance_waits_and_takes_over_without_fighting(bench):
    first = await bench.up()
    start = time.time()
    second = bench.serve(bench.kubeconfig(), name="second")
    await second.wait_for_log(lambda e: "Waiting for it to stop" in e.get("message", ""),
                              what="the newcomer waiting for the socket")
    claim = bench.claim("during-update", bench.device_names()[:2])
    assert (await bench.dra.prepare([claim])).ok, "the first one still serves"
    spec = bench.cdi / recorded_claims(bench.state)[claim.uid].claim_spec
    assert spec.exists()
    await asyncio.sleep(3.0)
    writes = bench.slice_writes(start)
    assert not writes, f"{len(writes)} slice writes while the first one serves"

    assert await first.terminate() == 0
    stopped = time.time()
    await second.wait_for_log(lambda e: "took over" in e.get("message", ""),
                              what="the newcomer taking over")
    await bench.until_alive(second, lambda: bench.dra.endpoints(DRIVER), "registered again")
    await asyncio.sleep(2.0)
    writes = bench.slice_writes(stopped)
    assert len(writes) <= len(bench.slices()), [(r.verb, r.name) for r in writes]
    assert len(bench.device_names()) == 8
    # The claim the first one prepared while the second waited is the second's to undo:
    # its record too, not only its spec.
    assert (await bench.dra.unprepare([claim])).ok
    assert not spec.exists(), "the claim's CDI spec was left behind"
    assert claim.uid not in recorded_claims(bench.state)
    await bench.wipe_is_undone(second)
