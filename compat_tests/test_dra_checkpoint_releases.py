"""The claim checkpoint across releases: rolled back and forward, prepared claims survive.

Against the real ``serve`` processes of both releases (the previous one taken from git
history, ``compat_tests/previous_release.py``), an emulated 1.36 kubelet DRA manager and API
server, one node, one state directory, one CDI directory (the rule in CHANGELOG.md,
"Checkpoint rule"):

* upgrade: claims the previous release prepared are unprepared by this one (their CDI specs
  removed), and one it prepared is answered the same devices again;
* rollback: claims this release prepared (its header carries fields the previous release
  does not know) are unprepared by the previous release, their specs removed;
* rollback across a major format (a synthetic next format): refused loudly naming both
  versions, the file left byte for byte, every prepare and unprepare refused so the kubelet
  calls again, and answered once the file reads again, without a restart;
* rollback while a claim holds a share of a device (format 3) to the code before shares
  (``BEFORE_SHARES_COMMIT``, which reads format 2 as 0.2.0 does): every claim refused with the
  reason, the file left whole; rolled forward, every claim is unprepared and the file is
  format 2 again.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from compat_tests.dra_bench import DRIVER, NODE, Bench, messages
from compat_tests.dra_support import recorded_claims
from compat_tests.kubelet.dra_results import ClaimRef
from compat_tests.plugin_process import PluginProcess
from compat_tests.previous_release import (
    BEFORE_SHARES,
    BEFORE_SHARES_COMMIT,
    LATER_PARTS,
    PREVIOUS_RELEASE,
    previous_release_tree,
)
from plugin.serving.dra import checkpoint_format
from plugin.serving.dra.checkpoint import ClaimCheckpoint
from plugin.serving.dra.driver import CHECKPOINT_FILE
from plugin.version import VERSION


@pytest.fixture(scope="session")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return previous_release_tree(tmp_path_factory.mktemp("releases"))


@pytest.fixture
def bench(dra_bench: Bench) -> Bench:
    """One node of emulated Kubernetes and a fake FPGA tree (compat_tests/conftest.py)."""
    return dra_bench


def serve_previous(bench: Bench, source: Path) -> PluginProcess:
    """The previous release's ``serve --api dra`` on the same node (its flags: no
    ``--events``, which came later)."""
    flags = ["--api", "dra", "--node-name", NODE, "--plugins-registry-dir",
             str(bench.registry), "--dra-state-dir", str(bench.state), "--cdi-spec-dir",
             str(bench.cdi), "--backend", "intel", "--sysfs-root", str(bench.fake.sysfs_root),
             "--dev-root", str(bench.fake.dev_root), "--health-interval", "0.2",
             "--kubeconfig", str(bench.kubeconfig())]
    plugin = PluginProcess(bench.sockdir, bench.logdir, name=f"release-{PREVIOUS_RELEASE}",
                           extra=flags, source=source).start()
    bench.plugins.append(plugin)
    return plugin


async def record_read(bench: Bench, plugin: PluginProcess) -> None:
    """The driver holds the kubelet's socket and has read its record (or said why not)."""
    await bench.until_alive(plugin, lambda: any(
        "claim checkpoint" in m for m in messages(plugin, "info", "error")),
        "the claim checkpoint read")
    await bench.until_alive(plugin, lambda: bench.dra.endpoints(DRIVER), "driver registered")


def specs_of(bench: Bench, claims: Sequence[ClaimRef]) -> dict[str, Path]:
    recorded = recorded_claims(bench.state)
    return {c.uid: bench.cdi / recorded[c.uid].claim_spec for c in claims}


async def prepare_two_and_stop(bench: Bench, plugin: PluginProcess
                               ) -> tuple[list[ClaimRef], dict[str, Path]]:
    """Two claims prepared (and a third prepared and unprepared, so the journal holds a
    removal too), their specs on disk; then the driver stops as a rollout stops it."""
    names = bench.device_names()
    claims = [bench.claim(f"held-{i}", names[i:i + 1]) for i in range(2)]
    gone = bench.claim("gone", names[2:3])
    for claim in (*claims, gone):
        outcome = await bench.dra.prepare([claim])
        assert outcome.ok, f"{outcome.error}\n{plugin.text()[-4000:]}"
    assert (await bench.dra.unprepare([gone])).ok
    specs = specs_of(bench, claims)
    assert all(spec.exists() for spec in specs.values())
    assert await plugin.terminate() == 0
    return claims, specs


async def unprepare_all(bench: Bench, plugin: PluginProcess, claims: Sequence[ClaimRef],
                        specs: dict[str, Path], errors_said: int = 0) -> None:
    for claim in claims:
        outcome = await bench.dra.unprepare([claim])
        assert outcome.ok, f"{outcome.error}\n{plugin.text()[-4000:]}"
        assert not specs[claim.uid].exists(), "its CDI spec is removed"
    assert dict(recorded_claims(bench.state)) == {}
    assert not list(bench.state.glob(f"{CHECKPOINT_FILE}.corrupt-*"))
    said = [m for m in messages(plugin, "error") if "checkpoint" in m]
    assert len(said) == errors_said, said


async def test_claims_the_previous_release_prepared_are_unprepared_after_an_upgrade(
        bench, previous):
    await bench.start_api()
    await bench.start_kubelet()
    old = serve_previous(bench, previous)
    await bench.published(old)
    claims, specs = await prepare_two_and_stop(bench, old)
    header = json.loads((bench.state / CHECKPOINT_FILE).read_text().splitlines()[0])
    assert "writtenBy" not in header, f"release {PREVIOUS_RELEASE} wrote it: {header}"

    new = bench.serve(bench.kubeconfig(), name="upgraded")
    await record_read(bench, new)
    again = await bench.dra.prepare([claims[0]])
    assert again.ok and again.cdi_ids(claims[0].uid), again.error
    await unprepare_all(bench, new, claims, specs)


async def test_claims_this_release_prepared_are_unprepared_after_a_rollback(bench, previous):
    plugin = await bench.up()
    claims, specs = await prepare_two_and_stop(bench, plugin)
    header = json.loads((bench.state / CHECKPOINT_FILE).read_text().splitlines()[0])
    assert header["writtenBy"] == VERSION and "minor" in header, "fields 0.1.0 never wrote"

    old = serve_previous(bench, previous)
    await record_read(bench, old)
    await unprepare_all(bench, old, claims, specs)


async def test_a_newer_major_format_is_refused_loudly_kept_whole_and_read_once_back(bench):
    plugin = await bench.up()
    claims, specs = await prepare_two_and_stop(bench, plugin)
    checkpoint = bench.state / CHECKPOINT_FILE
    ours, rest = checkpoint.read_text().split("\n", 1)
    newer = max(checkpoint_format.READ_VERSIONS) + 1
    checkpoint.write_text(json.dumps({"kind": checkpoint_format.KIND, "version": newer,
                                      "minor": 0, "writtenBy": "9.0.0"}) + "\n" + rest)
    before = checkpoint.read_bytes()

    rolled_back = bench.serve(bench.kubeconfig(), name="rolled-back")
    await record_read(bench, rolled_back)
    fresh = bench.claim("while-unreadable", bench.device_names()[3:4])
    for call in (bench.dra.prepare([fresh]), bench.dra.unprepare([claims[0]]),
                 bench.dra.unprepare([claims[1]])):
        outcome = await call
        assert not outcome.ok
        assert f"format version {newer}, written by release 9.0.0" in outcome.error
        assert f"(release {VERSION}) reads format versions 2 and 3" in outcome.error
    said = [m for m in messages(rolled_back, "error") if "checkpoint" in m]
    assert len(said) == 1, said
    assert f"format version {newer}" in said[0] and "reads format versions 2 and" in said[0]
    assert checkpoint.read_bytes() == before, "never written over"
    assert sorted(p.name for p in bench.state.iterdir()) == [CHECKPOINT_FILE], "never moved"
    assert all(spec.exists() for spec in specs.values()), "claims held are not let go"

    checkpoint.write_text(ours + "\n" + rest)  # the file reads again: no restart needed
    outcome = await bench.dra.prepare([fresh])
    assert outcome.ok, outcome.error
    await unprepare_all(bench, rolled_back, [*claims, fresh],
                        {**specs, **specs_of(bench, [fresh])}, errors_said=1)
    assert [m for m in messages(rolled_back, "warning") if "can be read again" in m]


@pytest.fixture(scope="session")
def before_shares(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return previous_release_tree(tmp_path_factory.mktemp("releases"), BEFORE_SHARES,
                                 BEFORE_SHARES_COMMIT, LATER_PARTS)


async def test_a_release_before_shares_refuses_every_claim_while_a_share_is_recorded(
        bench, before_shares):
    plugin = await bench.up()
    names = bench.device_names()
    whole, shared = bench.claim("whole", names[0:1]), bench.claim("shared", names[1:2])
    for claim in (whole, shared):
        outcome = await bench.dra.prepare([claim])
        assert outcome.ok, outcome.error
    assert await plugin.terminate() == 0
    # What this release records of a share: the prepared device with the allocation's
    # shareID and its contexts (devices are published shared with --dra-share, which the
    # publishing side brings; the record is this release's checkpoint code all the same).
    checkpoint = ClaimCheckpoint(bench.state / CHECKPOINT_FILE)
    recorded = checkpoint.get(shared.uid)
    await checkpoint.commit(put=[replace(recorded, devices=tuple(
        replace(d, share_id=str(uuid.uuid4()), contexts=1) for d in recorded.devices))])
    assert checkpoint.format_version == 3
    file = bench.state / CHECKPOINT_FILE
    before = file.read_bytes()
    specs = specs_of(bench, [whole, shared])

    flags = ["--api", "dra", "--node-name", NODE, "--events", "off", "--plugins-registry-dir",
             str(bench.registry), "--dra-state-dir", str(bench.state), "--cdi-spec-dir",
             str(bench.cdi), "--backend", "intel", "--sysfs-root", str(bench.fake.sysfs_root),
             "--dev-root", str(bench.fake.dev_root), "--health-interval", "0.2",
             "--kubeconfig", str(bench.kubeconfig())]
    old = PluginProcess(bench.sockdir, bench.logdir, name=f"release-{BEFORE_SHARES}",
                        extra=flags, source=before_shares).start()
    bench.plugins.append(old)
    await record_read(bench, old)
    fresh = bench.claim("fresh", names[2:3])
    for call in (bench.dra.prepare([fresh]), bench.dra.unprepare([whole]),
                 bench.dra.unprepare([shared])):
        outcome = await call
        assert not outcome.ok
        assert f"format version 3, written by release {VERSION}" in outcome.error, \
            outcome.error
        assert "reads format version 2 " in outcome.error or \
            "reads format version 2)" in outcome.error, outcome.error
    assert file.read_bytes() == before, "left byte for byte"
    assert all(spec.exists() for spec in specs.values()), "claims held are not let go"
    assert await old.terminate() == 0

    forward = bench.serve(bench.kubeconfig(), name="rolled-forward")
    await record_read(bench, forward)
    await unprepare_all(bench, forward, [whole, shared], specs)
    assert json.loads(file.read_text().split("\n", 1)[0])["version"] == 2
