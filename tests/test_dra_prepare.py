"""ClaimPreparer: what NodePrepareResources / NodeUnprepareResources decide, claim by claim."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

from plugin.serving.dra import claim_spec_files
from plugin.serving.dra.checkpoint import ClaimCheckpoint
from plugin.serving.dra.claim_cdi import ClaimSpecs, accelerator_env
from plugin.serving.dra.prepare import ClaimPreparer
from tests.cdi_conformance import check as check_cdi
from tests.dra_fakes import DRIVER, NAMES, PCI, POOL, FakeClaims, allocation, cdi_ids, ref
from value_types.devices import Device, DeviceSet


@pytest.fixture
def api():
    return FakeClaims()


@pytest.fixture
def checkpoint_path(tmp_path):
    return tmp_path / "checkpoint.json"


@pytest.fixture
def make(api, checkpoint_path, tmp_path):
    def make(**options):
        options.setdefault("checkpoint", ClaimCheckpoint(checkpoint_path))
        return ClaimPreparer(DRIVER, POOL, lambda: NAMES, api, cdi_ids, **options)
    return make


@pytest.fixture
def preparer(make):
    return make()


def cdi(pci):
    return f"b-com.com/accelerator={pci.replace(':', '-')}"


# -- preparing ----------------------------------------------------------------------------------

async def test_a_claim_is_read_checked_recorded_then_answered(api, preparer, checkpoint_path):
    api.add(allocation("u1", "fpga-0", "fpga-1"))
    results = await preparer.prepare([ref("u1")])
    assert list(results) == ["u1"]
    result = results["u1"]
    assert result.ok
    assert [(d.pool, d.device, d.request_names, d.cdi_ids) for d in result.devices] == [
        (POOL, "fpga-0", ("accel",), (cdi(PCI[0]),)),
        (POOL, "fpga-1", ("accel",), (cdi(PCI[1]),))]
    on_disk = ClaimCheckpoint(checkpoint_path).get("u1")
    assert (on_disk.ref.namespace, on_disk.ref.name) == ("ns", "claim-u1")
    assert [d.device_id for d in on_disk.devices] == PCI[:2]


async def test_a_repeated_prepare_answers_the_same_without_the_api_server(
        api, make, preparer, checkpoint_path):
    api.add(allocation("u1", "fpga-3"))
    first = await preparer.prepare([ref("u1")])
    api.errors["claim-u1"] = ConnectionError("connection refused")
    again = await preparer.prepare([ref("u1")])
    assert again == first and api.reads == ["claim-u1"]

    restarted = make(checkpoint=ClaimCheckpoint(checkpoint_path))
    assert await restarted.prepare([ref("u1")]) == first
    assert api.reads == ["claim-u1"], "the checkpoint answers after a restart too"


async def test_subrequests_are_kept_in_the_record_and_stripped_for_the_kubelet(api, preparer):
    api.add(allocation("u1", "fpga-0", request="accel/large"))
    device = (await preparer.prepare([ref("u1")]))["u1"].devices[0]
    assert device.requests == ("accel/large",)
    assert device.request_names == ("accel",), "the kubelet matches the container's request"


async def test_a_replaced_claim_is_refused_naming_both_uids(api, preparer):
    api.add(allocation("new-uid", "fpga-0", name="shared"))
    result = (await preparer.prepare([ref("old-uid", "shared")]))["old-uid"]
    assert result.error == ("claim ns/shared was replaced: the API server has UID new-uid, "
                            "the kubelet asked for old-uid")
    assert "old-uid" not in preparer.checkpoint


async def test_an_unallocated_claim_is_refused(api, preparer):
    api.add(allocation("u1", allocated=False))
    assert (await preparer.prepare([ref("u1")]))["u1"].error == \
        "claim ns/claim-u1 (u1) is not allocated"


async def test_devices_of_another_pool_or_unknown_here_are_refused_and_named(api, preparer):
    api.add(allocation("u1", "fpga-0", pool="node-2"),
            allocation("u2", "fpga-0", "fpga-77", "fpga-78"))
    results = await preparer.prepare([ref("u1"), ref("u2")])
    assert results["u1"].error == ("claim ns/claim-u1 (u1) is allocated devices of other "
                                   "pools: node-2/fpga-0 (this node's pool is node-1)")
    assert results["u2"].error == ("claim ns/claim-u2 (u2) is allocated devices pool node-1 "
                                   "does not have: fpga-77, fpga-78")
    assert len(preparer.checkpoint) == 0


async def test_other_drivers_results_are_theirs(api, preparer):
    theirs = allocation("u1", "gpu-0", driver="gpu.example.com", pool="other")
    ours = allocation("u1", "fpga-2")
    api.add(type(ours)(ours.ref, True, theirs.results + ours.results))
    result = (await preparer.prepare([ref("u1")]))["u1"]
    assert [d.device for d in result.devices] == ["fpga-2"]


async def test_the_device_names_are_read_when_the_claim_is(api, make):
    names = dict(NAMES)
    preparer = ClaimPreparer(DRIVER, POOL, lambda: names, api, cdi_ids,
                             make().checkpoint)
    api.add(allocation("u1", "fpga-new"))
    names["fpga-new"] = "0000:3b:00.0"
    assert (await preparer.prepare([ref("u1")]))["u1"].devices[0].device_id == "0000:3b:00.0"


async def test_api_server_trouble_is_per_claim_and_says_it_is_retried(api, preparer):
    api.add(allocation("ok", "fpga-0"), allocation("down", "fpga-1"))
    api.errors["claim-down"] = ConnectionError("connection refused")
    results = await preparer.prepare([ref("ok"), ref("down"), ref("gone")])
    assert results["ok"].ok
    assert results["down"].error == (
        "cannot read claim ns/claim-down (down) from the API server (unavailable; the kubelet "
        "will call again): ConnectionError: connection refused")
    assert results["gone"].error.startswith(
        "claim ns/claim-gone (gone) not found in the API server (deleted?)")
    assert list(preparer.checkpoint) == ["ok"]


class ApiFailure(Exception):
    """Shaped like plugin.serving.dra.apiserver's failures: a message and an HTTP status."""

    def __init__(self, message, status=None, unserved=False):
        super().__init__(message)
        self.status = status
        self.unserved = unserved


@pytest.mark.parametrize(("failure", "expected"), [
    (ApiFailure("resourceclaims \"c\" not found", 404),
     "claim ns/claim-u1 (u1) not found in the API server (deleted?): resourceclaims \"c\" "
     "not found"),
    (ApiFailure("forbidden: cannot get resourceclaims", 403),
     "the API server refused to give claim ns/claim-u1 (u1) (the driver needs get on "
     "resourceclaims): forbidden: cannot get resourceclaims"),
    (ApiFailure("404 page not found", 404, unserved=True),
     "cannot read claim ns/claim-u1 (u1) from the API server (unavailable; the kubelet will "
     "call again): ApiFailure: 404 page not found"),
    (ApiFailure("too many requests", 429),
     "cannot read claim ns/claim-u1 (u1) from the API server (unavailable; the kubelet will "
     "call again): ApiFailure: too many requests"),
])
async def test_the_api_clients_failures_are_worded_by_their_status(api, preparer, failure,
                                                                   expected):
    api.errors["claim-u1"] = failure
    assert (await preparer.prepare([ref("u1")]))["u1"].error == expected


async def test_a_hanging_read_times_out_as_an_error_of_that_claim(api, make):
    preparer = make(read_timeout=0.1)
    api.add(allocation("ok", "fpga-0"), allocation("slow", "fpga-1"))
    api.hang.add("claim-slow")
    results = await preparer.prepare([ref("ok"), ref("slow")])
    assert results["ok"].ok
    assert "timed out after 0.1 s; the kubelet will call again" in results["slow"].error
    assert api.cancelled == ["claim-slow"]


async def test_the_call_is_answered_before_its_deadline(api, preparer):
    api.add(allocation("ok", "fpga-0"), allocation("slow", "fpga-1"))
    api.hang.add("claim-slow")
    results = await preparer.prepare([ref("ok"), ref("slow")], timeout=0.2)
    assert results["ok"].ok and "could not be prepared within 0 s" in results["slow"].error
    assert list(preparer.checkpoint) == ["ok"]


@pytest.mark.parametrize("with_env", [False, True])
async def test_a_thousand_claims_in_one_call_are_bounded_and_written_once(
        api, make, tmp_path, with_env):
    """How fast is bench/dra.py's; here: reads in parallel but bounded, one write."""
    preparer = make(claim_specs=env_specs(tmp_path) if with_env else None)
    api.delay = 0.001
    for i in range(1000):
        api.add(allocation(f"u{i}", f"fpga-{i % 8}"))
    claims = [ref(f"u{i}") for i in range(1000)]
    results = await preparer.prepare(claims)
    assert len(results) == 1000 and all(r.ok for r in results.values())
    assert api.most_in_flight == 32, "at most 32 reads at a time, and that many in parallel"
    assert preparer.checkpoint.writes == 1, "one checkpoint write per call"
    assert len(ClaimCheckpoint(preparer.checkpoint.path)) == 1000
    assert len(list(tmp_path.glob("cdi/*.json"))) == (1000 if with_env else 0)


async def test_the_read_bound_holds_across_concurrent_calls(api, make):
    preparer = make(concurrency=4)
    api.delay = 0.01
    for i in range(40):
        api.add(allocation(f"u{i}", "fpga-0"))
    calls = [preparer.prepare([ref(f"u{i}") for i in range(j, 40, 4)]) for j in range(4)]
    answers = await asyncio.gather(*calls)
    assert sum(len(a) for a in answers) == 40 and api.most_in_flight == 4


async def test_a_claim_asked_twice_in_one_call_is_read_once(api, preparer):
    api.add(allocation("u1", "fpga-0"))
    results = await preparer.prepare([ref("u1"), ref("u1")])
    assert list(results) == ["u1"] and api.reads == ["claim-u1"]


async def test_a_failing_cdi_lookup_names_the_claim_and_the_device(api, checkpoint_path):
    def broken(device_id):
        raise KeyError(device_id)

    preparer = ClaimPreparer(DRIVER, POOL, lambda: NAMES, api, broken,
                             ClaimCheckpoint(checkpoint_path))
    api.add(allocation("u1", "fpga-4"))
    assert (await preparer.prepare([ref("u1")]))["u1"].error == (
        "claim ns/claim-u1 (u1): no CDI IDs for device node-1/fpga-4 (0000:af:00.0): "
        "'0000:af:00.0'")


async def test_a_bug_in_reading_is_an_error_of_that_claim_not_of_the_call(api, make):
    async def buggy(claim):
        if claim.uid == "bad":
            return None  # not a ClaimAllocation: attribute errors follow
        return await api(claim)

    preparer = ClaimPreparer(DRIVER, POOL, lambda: NAMES, buggy, cdi_ids, make().checkpoint)
    api.add(allocation("ok", "fpga-0"))
    results = await preparer.prepare([ref("bad"), ref("ok")])
    assert results["ok"].ok
    assert results["bad"].error.startswith("claim ns/claim-bad (bad): internal error of the "
                                           "driver: AttributeError")


async def test_a_checkpoint_that_cannot_be_written_fails_the_claims_it_would_record(
        api, make, tmp_path, monkeypatch):
    specs = ClaimSpecs(tmp_path / "cdi", DRIVER, lambda ids: {"ACCELERATOR_UNITS": ",".join(ids)})
    preparer = make(claim_specs=specs)
    api.add(allocation("u1", "fpga-0"))
    import plugin.serving.dra.checkpoint as module

    def full(*_args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(module, "_write_atomically", full)
    result = (await preparer.prepare([ref("u1")]))["u1"]
    assert result.error.startswith("claim ns/claim-u1 (u1) could not be recorded: cannot write "
                                   "the claim checkpoint")
    assert "No space left on device" in result.error
    assert list((tmp_path / "cdi").iterdir()) == [], "no spec left for an unrecorded claim"


async def test_while_the_checkpoint_is_a_newer_format_no_claim_is_answered_from_it(
        api, make, checkpoint_path, tmp_path):
    """After a rollback across a major format the driver cannot tell which claims it holds:
    an unprepare answered as done would let the kubelet forget a claim whose spec stays, and a
    prepare would write over the newer release's record. Both are refused, claim by claim,
    until the file reads again; then the claim recorded before is unprepared as usual."""
    from plugin.serving.dra import checkpoint_format

    specs = ClaimSpecs(tmp_path / "cdi", DRIVER, lambda ids: {"ACCELERATOR_UNITS": ",".join(ids)})
    api.add(allocation("u1", "fpga-0"), allocation("u2", "fpga-1"))
    assert (await make(claim_specs=specs).prepare([ref("u1")]))["u1"].ok
    [spec] = (tmp_path / "cdi").iterdir()
    header, rest = checkpoint_path.read_text().split("\n", 1)
    newer = header.replace(f'"version":{checkpoint_format.FORMAT_VERSION}', '"version":4')
    checkpoint_path.write_text(newer + "\n" + rest)
    before = checkpoint_path.read_bytes()

    rolled_back = make(claim_specs=specs, checkpoint=ClaimCheckpoint(checkpoint_path))
    prepared = await rolled_back.prepare([ref("u1"), ref("u2")])
    unprepared = await rolled_back.unprepare([ref("u1"), ref("never-prepared")])
    for error in [r.error for r in prepared.values()] + list(unprepared.values()):
        assert error.startswith(f"the DRA driver's claim checkpoint {checkpoint_path} cannot "
                                "be read (format version 4, written by release"), error
        assert "reads format versions 2 and 3" in error
        assert "the kubelet will call again" in error
    assert set(prepared) == {"u1", "u2"} and set(unprepared) == {"u1", "never-prepared"}
    assert spec.exists() and checkpoint_path.read_bytes() == before
    assert api.reads == ["claim-u1"], "nothing read for a call that cannot be recorded"

    checkpoint_path.write_text(header + "\n" + rest)  # the release that reads it is back
    assert await rolled_back.unprepare([ref("u1")]) == {"u1": ""}
    assert not spec.exists() and len(ClaimCheckpoint(checkpoint_path)) == 0


async def test_a_cancelled_prepare_records_nothing_and_leaves_no_spec(api, make, tmp_path):
    specs = ClaimSpecs(tmp_path / "cdi", DRIVER, lambda ids: {"ACCELERATOR_UNITS": ",".join(ids)})
    preparer = make(claim_specs=specs)
    api.add(allocation("fast", "fpga-0"), allocation("slow", "fpga-1"))
    api.hang.add("claim-slow")
    call = asyncio.create_task(preparer.prepare([ref("fast"), ref("slow")]))
    while {"claim-fast", "claim-slow"} - set(api.reads):
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # the fast claim is read and checked, the slow one hangs
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert api.cancelled == ["claim-slow"]
    assert len(preparer.checkpoint) == 0 and list((tmp_path / "cdi").glob("*.json")) == []


async def test_a_call_cancelled_while_a_worker_writes_its_specs_leaves_none(
        api, make, tmp_path, monkeypatch):
    """Many claims' specs are written on a worker thread, which a cancellation cannot stop:
    the call waits for it, then removes what it wrote."""
    specs = env_specs(tmp_path)
    preparer = make(claim_specs=specs)
    count = claim_spec_files.INLINE_FILE_OPS + 4
    for i in range(count):
        api.add(allocation(f"u{i}", f"fpga-{i % 8}"))
    started, real_write = threading.Event(), specs.write

    def slow_write(uid, groups, shares=None):
        started.set()
        time.sleep(0.01)
        return real_write(uid, groups, shares)

    monkeypatch.setattr(specs, "write", slow_write)
    call = asyncio.create_task(preparer.prepare([ref(f"u{i}") for i in range(count)]))
    while not started.is_set():
        await asyncio.sleep(0.005)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert len(preparer.checkpoint) == 0
    assert list((tmp_path / "cdi").glob("*.json")) == [], "every spec written was removed"


async def test_a_few_claims_are_written_without_a_worker_thread(api, make, tmp_path,
                                                                 monkeypatch):
    """What keeps a one-pod prepare close to a driver that writes nothing: its spec and its
    checkpoint line are written on the event loop, without a hop to a worker thread."""
    preparer = make(claim_specs=env_specs(tmp_path))
    api.add(allocation("warm", "fpga-1"), allocation("u1", "fpga-0"))
    hops = []
    real = asyncio.to_thread

    async def counted(func, *args, **kwargs):
        hops.append(func)
        return await real(func, *args, **kwargs)

    await preparer.prepare([ref("warm")])  # the checkpoint file is created (a rewrite)
    monkeypatch.setattr(asyncio, "to_thread", counted)
    assert (await preparer.prepare([ref("u1")]))["u1"].ok
    assert (await preparer.unprepare([ref("u1")])) == {"u1": ""}
    assert hops == []
    assert [p.name for p in tmp_path.glob("cdi/*.json")] == [f"{DRIVER}_claim_warm.json"]


# -- the claim's environment --------------------------------------------------------------------

def env_specs(tmp_path, devices=None):
    devices = devices or DeviceSet.of(Device(p, "intel") for p in PCI)
    return ClaimSpecs(tmp_path / "cdi", DRIVER, lambda ids: accelerator_env(ids, devices))


async def test_each_request_gets_its_environment_through_its_first_device(api, make, tmp_path):
    specs = env_specs(tmp_path)
    preparer = make(claim_specs=specs)
    both = allocation("u1", "fpga-0", "fpga-1", request="a")
    other = allocation("u1", "fpga-2", request="b/small")
    api.add(type(both)(both.ref, True, both.results + other.results))
    devices = (await preparer.prepare([ref("u1")]))["u1"].devices
    env_a, env_b = (f"{DRIVER}/claim=u1-a", f"{DRIVER}/claim=u1-b")
    assert [d.cdi_ids for d in devices] == [
        (cdi(PCI[0]), env_a), (cdi(PCI[1]),), (cdi(PCI[2]), env_b)]

    spec = json.loads((tmp_path / "cdi" / f"{DRIVER}_claim_u1.json").read_text())
    check_cdi(spec)
    assert spec["cdiVersion"] == "0.5.0" and spec["kind"] == f"{DRIVER}/claim"
    assert {d["name"]: d["containerEdits"]["env"] for d in spec["devices"]} == {
        "u1-a": [f"ACCELERATOR_DEVICES={PCI[0]},{PCI[1]}", f"ACCELERATOR_UNITS={PCI[0]},{PCI[1]}"],
        "u1-b": [f"ACCELERATOR_DEVICES={PCI[2]}", f"ACCELERATOR_UNITS={PCI[2]}"]}

    assert await preparer.unprepare([ref("u1")]) == {"u1": ""}
    assert list((tmp_path / "cdi").iterdir()) == []


async def test_a_request_of_shares_names_each_share_aligned_with_its_devices(api, make,
                                                                             tmp_path):
    """Shares and a whole device in one request: the share variables line up with
    ACCELERATOR_DEVICES, empty where a device is held whole; a repeated prepare after a
    reboot writes the same spec back."""
    from dataclasses import replace

    specs = env_specs(tmp_path)
    preparer = make(claim_specs=specs, published_contexts=lambda: {PCI[0]: 4, PCI[1]: 2})
    plain = allocation("u1", "fpga-0", "fpga-1", "fpga-2")
    first, second = "5f0c2a9e-3b1d-4c7e-8a6f-2d9e1b7c4a30", "9a7b3c2d-1e0f-4a5b-8c6d-7e8f9a0b1c2d"
    results = (replace(plain.results[0], share_id=first, consumed_contexts=3),
               replace(plain.results[1], share_id=second), plain.results[2])
    api.add(replace(plain, results=results))
    devices = (await preparer.prepare([ref("u1")]))["u1"].devices
    assert [(d.share_id, d.contexts) for d in devices] == [(first, 3), (second, 1),
                                                           (None, None)]
    path = tmp_path / "cdi" / f"{DRIVER}_claim_u1.json"
    written = path.read_text()
    [device] = json.loads(written)["devices"]
    assert device["containerEdits"]["env"] == [
        f"ACCELERATOR_DEVICES={PCI[0]},{PCI[1]},{PCI[2]}",
        "ACCELERATOR_SHARE_CONTEXTS=3,1,", f"ACCELERATOR_SHARE_ID={first},{second},",
        f"ACCELERATOR_UNITS={PCI[0]},{PCI[1]},{PCI[2]}"]

    path.unlink()  # /var/run/cdi is a tmpfs
    assert (await preparer.prepare([ref("u1")]))["u1"].devices == devices
    assert path.read_text() == written


async def test_units_get_only_accelerator_units_like_allocate_gives_them(api, tmp_path, make):
    units = DeviceSet.of(Device(str(i), "units") for i in range(4))
    specs = env_specs(tmp_path, units)
    preparer = ClaimPreparer(DRIVER, POOL, lambda: {f"unit-{i}": str(i) for i in range(4)},
                             api, lambda _id: [], make().checkpoint, claim_specs=specs)
    api.add(allocation("8f0c", "unit-2", "unit-0"))
    devices = (await preparer.prepare([ref("8f0c")]))["8f0c"].devices
    assert [d.cdi_ids for d in devices] == [(f"{DRIVER}/claim=8f0c-accel",), ()]
    spec = json.loads((tmp_path / "cdi" / f"{DRIVER}_claim_8f0c.json").read_text())
    check_cdi(spec)
    assert spec["devices"][0]["containerEdits"]["env"] == ["ACCELERATOR_UNITS=2,0"]


async def test_a_repeated_prepare_puts_back_a_spec_a_reboot_took(api, make, tmp_path):
    preparer = make(claim_specs=env_specs(tmp_path))
    api.add(allocation("u1", "fpga-0"))
    first = await preparer.prepare([ref("u1")])
    spec = tmp_path / "cdi" / f"{DRIVER}_claim_u1.json"
    text = spec.read_text()
    spec.unlink()  # /var/run/cdi is a tmpfs: gone after a reboot, the checkpoint is not
    assert await preparer.prepare([ref("u1")]) == first
    assert spec.read_text() == text and api.reads == ["claim-u1"]


async def test_a_spec_that_cannot_be_written_fails_the_claim(api, make, tmp_path):
    blocked = tmp_path / "cdi"
    blocked.write_text("a file where the directory should be")
    preparer = make(claim_specs=ClaimSpecs(blocked, DRIVER, lambda ids: {"X": "1"}))
    api.add(allocation("u1", "fpga-0"))
    error = (await preparer.prepare([ref("u1")]))["u1"].error
    assert error.startswith(f"cannot write the CDI spec of claim ns/claim-u1 (u1) into {blocked}")
    assert len(preparer.checkpoint) == 0


# -- unpreparing --------------------------------------------------------------------------------

async def test_unprepare_uses_only_the_checkpoint_and_is_idempotent(api, make, preparer,
                                                                    checkpoint_path):
    api.add(allocation("u1", "fpga-0"), allocation("u2", "fpga-1"))
    await preparer.prepare([ref("u1"), ref("u2")])
    api.claims.clear()  # the claims are gone from the API server
    api.errors["claim-u1"] = ConnectionError("unreachable")

    restarted = make(checkpoint=ClaimCheckpoint(checkpoint_path))
    assert await restarted.unprepare([ref("u1"), ref("never")]) == {"u1": "", "never": ""}
    assert list(ClaimCheckpoint(checkpoint_path)) == ["u2"]
    assert await restarted.unprepare([ref("u1")]) == {"u1": ""}
    assert api.reads == ["claim-u1", "claim-u2"], "no read at unprepare"


async def test_an_unprepare_that_cannot_be_recorded_fails_only_the_known_claims(
        api, preparer, monkeypatch):
    api.add(allocation("u1", "fpga-0"))
    await preparer.prepare([ref("u1")])
    import plugin.serving.dra.checkpoint as module

    def full(*_args):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(module, "_write_atomically", full)
    monkeypatch.setattr(module, "_append_line", full)
    results = await preparer.unprepare([ref("u1"), ref("other")])
    assert results["other"] == ""
    assert results["u1"].startswith("claim ns/claim-u1 (u1) could not be unrecorded")
    assert "u1" in preparer.checkpoint


async def test_unprepare_removes_a_spec_the_checkpoint_forgot(api, make, tmp_path):
    specs = env_specs(tmp_path)
    (tmp_path / "cdi").mkdir()
    orphan = tmp_path / "cdi" / specs.file_name("u9")
    orphan.write_text("{}")
    preparer = make(claim_specs=specs)
    assert await preparer.unprepare([ref("u9")]) == {"u9": ""}
    assert not orphan.exists()
