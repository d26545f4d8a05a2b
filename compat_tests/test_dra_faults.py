"""DRA faults a real cluster throws, against the real ``serve --api dra`` process.

Between an emulated API server (``compat_tests/apiserver``) and an emulated 1.36 kubelet DRA
manager, over real sockets and real HTTP (:mod:`compat_tests.dra_bench`); each case turns
one fault on and asserts what a cluster would see: the slices converge, the kubelet's health
stream and prepare calls keep answering, requests stay bounded while the fault lasts, the
fault is logged once, and the process never has to be restarted to recover.

These are the API server's faults: credentials that rotate, conflicts and expired
watches, RBAC, errors and overload, and the server upgraded behind the same address; the
node's own are in ``test_dra_node_faults``.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
import textwrap
import time
from pathlib import Path

import pytest

from compat_tests.apiserver import DEFAULT_USER
from compat_tests.dra_bench import (
    BACKOFF_SEEN,
    DRIVER,
    V1BETA1_ONLY,
    Bench,
    messages,
    port_device,
)
from compat_tests.fake_sysfs import CRASHED_AFU_ID, DEFAULT_AFU_ID
from compat_tests.plugin_process import PluginProcess, run_at_start_up


@pytest.fixture
def bench(dra_bench: Bench) -> Bench:
    """One node of emulated Kubernetes and a fake FPGA tree (compat_tests/conftest.py)."""
    return dra_bench


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
    await bench.wipe_is_undone(plugin)  # only a watch made anew can see the wipe


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
    await bench.until_alive(plugin, lambda: bench.tainted(name), "crash published")
    updates = [r.status for r in bench.slice_writes() if r.verb == "update"]
    assert updates.count(409) == 1 and updates[-1] == 200, updates
    # At once: the back-off is the branch that says the slices "keep changing".
    said = [m for m in messages(plugin) if "keep changing" in m or "409" in m]
    assert not said, said


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
    result = outcome.result(claim.uid)
    assert result.answered and not result.ok, "the read outlasting the timeout is an error"
    assert "API server" in result.error, result.error
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
    await bench.until_alive(plugin, lambda: writes_through(bench, "v1", start),
                            "slices written through v1")
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
    await bench.until_alive(plugin, lambda: writes_through(bench, "v1beta1", start),
                            "slices written through v1beta1")
    # Never published untainted: tainted (a slice using taints keeps them on a server with
    # the gate off: ratcheting), or left out where the server drops them.
    await asyncio.sleep(1.0)
    assert not bench.untainted(crashed), bench.devices().get(crashed)
    bench.fake.set_afu_id(crashed_port, DEFAULT_AFU_ID)
    await bench.until_alive(plugin, lambda: bench.untainted(crashed),
                            "recovery published through v1beta1")
    await bench.wipe_is_undone(plugin)
