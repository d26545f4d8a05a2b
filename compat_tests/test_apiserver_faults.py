"""Faults on demand: outages, slowness, failures, conflicts, upgrades, also from another process.

A driver's recovery code only runs when the API server misbehaves; these tests pin down that
the emulator misbehaves the way a real one does, as a client sees it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
import yaml

from compat_tests.apiserver import objects as o
from compat_tests.apiserver.client import ApiClient, path

DRIVER = "fpga.example.com"
SLICES = path("resourceslices")


def a_slice(name="node-a-fpga", node="node-a"):
    return o.resource_slice(name, driver=DRIVER, node_name=node, devices=[o.device("fpga-0")])


async def test_outage_refuses_connections_and_comeback_keeps_state(api, client):
    created = (await client.create(SLICES, a_slice())).body
    port = api.port
    await api.go_down()
    assert not api.is_up
    with pytest.raises(aiohttp.ClientConnectorError):
        await client.get(SLICES)
    await api.come_back()
    assert api.port == port
    again = await client.get(path("resourceslices", "v1", "node-a-fpga"))
    assert again.status == 200
    assert again.body["metadata"]["uid"] == created["metadata"]["uid"]
    assert again.body["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


async def test_outage_cuts_open_watches(api, client):
    events = []

    async def follow():
        async for event in client.watch(SLICES):
            events.append(event)

    task = asyncio.ensure_future(follow())
    await asyncio.sleep(0.2)
    await api.go_down()
    with pytest.raises(aiohttp.ClientError):
        await asyncio.wait_for(task, 3)
    await api.come_back()


async def test_timed_outage_comes_back_by_itself(api, client):
    await api.outage(0.3)
    with pytest.raises(aiohttp.ClientConnectorError):
        await client.get(SLICES)
    await asyncio.sleep(0.6)
    assert (await client.get(SLICES)).status == 200


async def test_slow_answers(api, client):
    api.faults.delay = 0.3
    started = time.monotonic()
    assert (await client.get(SLICES)).status == 200
    assert time.monotonic() - started >= 0.3


@pytest.mark.parametrize(("code", "reason"), [
    (500, "InternalError"), (503, "ServiceUnavailable"), (429, None), (403, "Forbidden"),
])
async def test_next_requests_fail_with_the_given_status(api, client, code, reason):
    api.faults.fail_next(2, code, retry_after=3, verb="create")
    assert (await client.get(SLICES)).status == 200  # not a create: untouched
    for _ in range(2):
        reply = await client.create(SLICES, a_slice())
        assert reply.status == code
        assert reply.reason == reason
    if code == 429:  # priority and fairness answers in plain text, with Retry-After
        assert reply.headers["Retry-After"] == "3"
        assert reply.body == "Too many requests, please try again later.\n"
    assert (await client.create(SLICES, a_slice())).status == 201


async def test_forced_conflict_on_the_next_update(api, client):
    created = (await client.create(SLICES, a_slice())).body
    api.conflict_next()
    target = path("resourceslices", "v1", "node-a-fpga")
    first = await client.update(target, created)
    assert first.status == 409
    assert first.reason == "Conflict"
    created["metadata"]["labels"] = {"x": "y"}
    assert (await client.update(target, created)).status == 200


async def test_an_upgrade_from_133_to_136_behind_the_same_address(start_api):
    api, client = await start_api(
        "1.33", runtime_config="resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true")
    written = (await client.create(path("resourceslices", "v1beta1"), {
        **a_slice(), "apiVersion": "resource.k8s.io/v1beta1",
        "spec": {**a_slice()["spec"], "devices": [{"name": "fpga-0", "basic": {}}]}})).body
    assert (await client.get(path("resourceslices", "v1"))).status == 404
    await api.restart("1.36")
    assert (await client.get("/apis/resource.k8s.io")).body["preferredVersion"]["version"] == "v1"
    assert (await client.get(path("resourceslices", "v1beta1"))).status == 404
    now = (await client.get(path("resourceslices", "v1", "node-a-fpga"))).body
    assert now["metadata"]["uid"] == written["metadata"]["uid"]
    assert now["spec"]["devices"] == [{"name": "fpga-0"}]


async def test_https_with_the_emulators_ca(start_api, tmp_path):
    api, client = await start_api("1.36", tls_dir=tmp_path / "tls")
    assert api.url.startswith("https://127.0.0.1:")
    assert (tmp_path / "tls" / "ca.crt").exists()
    assert (await client.get("/version")).status == 200
    async with ApiClient(api.url.replace("https", "https"), api.token) as untrusted:
        untrusted._ssl = __import__("ssl").create_default_context()
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await untrusted.get("/version")
    config = yaml.safe_load(api.write_kubeconfig(tmp_path / "kubeconfig").read_text())
    assert config["clusters"][0]["cluster"] == {"server": api.url,
                                                "certificate-authority": str(api.ca_file)}
    assert config["users"][0]["user"] == {"token": api.token}


# --- another process: the CLI and the control API -----------------------------------------


@pytest.fixture
def emulator_process(tmp_path):
    """``python -m compat_tests.apiserver`` with TLS, a control port and a kubeconfig."""
    kubeconfig = tmp_path / "kubeconfig"
    process = subprocess.Popen(
        [sys.executable, "-m", "compat_tests.apiserver", "--model", "1.36", "--tls",
         "--control-port", "0", "--kubeconfig-out", str(kubeconfig), "--node", "node-a",
         "--token", "t-1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=Path(__file__).resolve().parent.parent, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines: dict[str, str] = {}
    try:
        while "kubeconfig" not in lines:
            line = process.stdout.readline()
            assert line, process.stderr.read()
            key, _, value = line.strip().partition("=")
            lines[key] = value
        yield lines, kubeconfig
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()


async def test_cli_serves_with_kubeconfig_and_control_api(emulator_process):
    lines, kubeconfig = emulator_process
    config = yaml.safe_load(kubeconfig.read_text())
    cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
    assert cluster["server"] == lines["url"] and user["token"] == "t-1"
    control = lines["control_url"]
    async with ApiClient(cluster["server"], user["token"],
                         Path(cluster["certificate-authority"])) as client, \
            aiohttp.ClientSession() as session:
        node = await client.get("/api/v1/nodes/node-a")
        assert node.status == 200 and node.body["metadata"]["uid"]
        async with session.post(f"{control}/_emulator/faults",
                                json={"fail_next": {"count": 1, "status": 503}}) as reply:
            assert reply.status == 200
        assert (await client.get(SLICES)).status == 503
        assert (await client.get(SLICES)).status == 200
        async with session.post(f"{control}/_emulator/claims/allocated", json={
                "namespace": "default", "name": "c1", "driver": DRIVER, "pool": "node-a",
                "devices": ["fpga-0"]}) as reply:
            assert reply.status == 200, await reply.text()
        claim = await client.get(path("resourceclaims", "v1", "c1", "default"))
        assert claim.body["status"]["allocation"]["devices"]["results"][0]["device"] == "fpga-0"
        async with session.post(f"{control}/_emulator/down") as reply:
            assert (await reply.json()) == {"scheduled": True}
        await asyncio.sleep(0.3)
        with pytest.raises(aiohttp.ClientConnectorError):
            await client.get(SLICES)
        async with session.get(f"{control}/_emulator/state") as reply:
            state = await reply.json()
        assert state["up"] is False and state["objects"]["resourceclaims"] == 1
        async with session.post(f"{control}/_emulator/up") as reply:
            assert reply.status == 200
        assert (await client.get(path("resourceclaims", "v1", "c1", "default"))).status == 200
        async with session.get(f"{control}/_emulator/requests") as reply:
            logged = await reply.json()
        assert [r["status"] for r in logged if r["resource"] == "resourceslices"][:2] == [503, 200]
        async with session.post(f"{control}/_emulator/validate", json={
                "object": o.resource_slice("x", driver=DRIVER, node_name="n",
                                           devices=[o.device("Bad")])}) as reply:
            assert "spec.devices[0].name" in json.dumps(await reply.json())


def test_cli_refuses_a_runtime_config_the_release_does_not_have():
    result = subprocess.run(
        [sys.executable, "-m", "compat_tests.apiserver", "--model", "1.32", "--runtime-config",
         "resource.k8s.io/v1=true"], capture_output=True, text=True, timeout=60,
        cwd=Path(__file__).resolve().parent.parent)
    assert result.returncode == 2
    assert "unknown api group version" in result.stderr


async def test_unfiltered_failures_hit_discovery_too(api, client):
    api.faults.fail_next(1, 503)
    assert (await client.get("/apis")).status == 503
    api.faults.fail_next(1, 503, resource="resourceslices")
    assert (await client.get("/apis")).status == 200
    assert (await client.get(SLICES)).status == 503


async def test_deleting_a_node_collects_the_slices_it_owns(api, client):
    node = api.create_node("node-a")
    owned = a_slice("owned")
    owned["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node",
                                             "name": "node-a", "uid": node["metadata"]["uid"],
                                             "controller": True}]
    assert (await client.create(SLICES, owned)).status == 201
    assert (await client.create(SLICES, a_slice("free"))).status == 201
    assert api.delete_node("node-a") == ["owned"]
    assert [s["metadata"]["name"] for s in (await client.get(SLICES)).body["items"]] == ["free"]
