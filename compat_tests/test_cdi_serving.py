"""CDI end to end: the real ``serve`` writes specs a runtime can read and names devices in
Allocate for kubelets that read ``cdi_devices``; specs follow the resources and go on stop."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from compat_tests.fake_sysfs import OTHER_AFU_ID, FakeNode
from tests.cdi_conformance import check

RESOURCE = "b-com.com/accelerator"
SETTLE = 15.0


def specs(directory: Path) -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))}


async def test_units_get_their_env_and_no_cdi_name(kubelet, plugin, tmp_path):
    """A unit has no node or mount to inject; a CDI device with empty edits makes the runtime
    refuse the whole spec (and the container), so units are neither in a spec nor named."""
    cdi = tmp_path / "cdi"
    node = await kubelet("1.32")
    daemon = plugin(nb_units=4, extra=["--cdi", "--cdi-spec-dir", str(cdi)])
    await node.wait_for_devices(RESOURCE, timeout=SETTLE)
    assert specs(cdi) == {}
    answer = await node.allocate(RESOURCE, ["2", "3"])
    assert list(answer.cdi_devices) == []
    assert answer.envs["ACCELERATOR_UNITS"] == "2,3", "the env stays in Allocate"
    assert await daemon.terminate() == 0


async def test_specs_follow_the_devices_and_go_on_stop(kubelet, plugin, tmp_path):
    fake = FakeNode(tmp_path / "node")
    fake.add_dfl_card("0000:3b:00.0")
    cdi = tmp_path / "cdi"
    node = await kubelet("1.32")
    daemon = plugin(extra=["--backend", "intel", "--sysfs-root", str(fake.sysfs_root),
                           "--dev-root", str(fake.dev_root), "--resource-name",
                           "example.com/fpga.v2", "--cdi", "--cdi-spec-dir", str(cdi)])
    await node.wait_for_devices("example.com/fpga.v2", timeout=SETTLE)
    [(name, written)] = specs(cdi).items()
    check(written)
    assert written["cdiVersion"] == "0.5.0", "a dotted resource name keeps the spec at 0.5.0"
    answer = await node.allocate("example.com/fpga.v2", ["0000:3b:00.0"])
    assert list(answer.cdi_devices) == [f"{written['kind']}=0000-3b-00.0"]
    assert name == written["kind"].replace("/", "_") + ".json"
    assert await daemon.terminate() == 0
    assert specs(cdi) == {}, "specs removed on stop"


async def test_cdi_only_strategy_drops_device_specs_and_alpha_kubelets_get_none(
        kubelet, plugin, tmp_path):
    fake = FakeNode(tmp_path / "node")
    fake.add_dfl_card("0000:3b:00.0")
    cdi = tmp_path / "cdi"
    flags = ["--backend", "intel", "--sysfs-root", str(fake.sysfs_root), "--dev-root",
             str(fake.dev_root), "--cdi", "--cdi-spec-dir", str(cdi),
             "--device-list-strategy", "cdi"]
    node = await kubelet("1.32")
    plugin(extra=flags)
    await node.wait_for_devices(RESOURCE, timeout=SETTLE)
    answer = await node.allocate(RESOURCE, ["0000:3b:00.0"])
    assert list(answer.cdi_devices) == ["b-com.com/accelerator=0000-3b-00.0"]
    assert list(answer.devices) == [], "CDI only"
    [spec] = specs(cdi).values()
    assert spec["devices"][0]["containerEdits"]["deviceNodes"][0]["hostPath"] \
        == "/dev/dfl-port.0"
    await node.stop()
    old = await kubelet("1.9")
    await old.wait_for_devices(RESOURCE, timeout=SETTLE)
    answer = await old.allocate(RESOURCE, ["0000:3b:00.0"])
    assert not answer.cdi_devices and [d.host_path for d in answer.devices] \
        == ["/dev/dfl-port.0"], "the alpha generations never get CDI: DeviceSpecs as before"


async def test_afu_mode_specs_follow_the_resources(kubelet, plugin, tmp_path):
    fake = FakeNode(tmp_path / "node")
    fake.add_dfl_card("0000:3b:00.0")
    [other] = fake.add_dfl_card("0000:d8:00.0", afu_id=OTHER_AFU_ID)
    cdi = tmp_path / "cdi"
    node = await kubelet("1.32")
    plugin(extra=["--backend", "intel", "--sysfs-root", str(fake.sysfs_root), "--dev-root",
                  str(fake.dev_root), "--resource-mode", "afu", "--cdi", "--cdi-spec-dir",
                  str(cdi), "--rescan-interval", "0.2"])
    await node.wait_until(lambda: len(node.registrations) == 2, timeout=SETTLE,
                          what="two resources")
    assert len(specs(cdi)) == 2
    fake.remove_port(other)
    await node.wait_until(lambda: len(specs(cdi)) == 1, timeout=SETTLE,
                          what="the emptied resource's spec removed")
    for spec in specs(cdi).values():
        check(spec)


async def test_a_resource_whose_devices_change_gets_its_spec_rewritten(kubelet, plugin, tmp_path):
    fake = FakeNode(tmp_path / "node")
    fake.add_dfl_card("0000:3b:00.0")
    [second] = fake.add_dfl_card("0000:d8:00.0")
    cdi = tmp_path / "cdi"
    node = await kubelet("1.28")
    plugin(extra=["--backend", "intel", "--sysfs-root", str(fake.sysfs_root), "--dev-root",
                  str(fake.dev_root), "--cdi", "--cdi-spec-dir", str(cdi),
                  "--rescan-interval", "0.2"])
    await node.wait_for_devices(RESOURCE, lambda held: len(held) == 2, timeout=SETTLE)

    def names() -> list[str]:
        return [d["name"] for s in specs(cdi).values() for d in s["devices"]]

    assert names() == ["0000-3b-00.0", "0000-d8-00.0"]
    fake.remove_port(second)
    await node.wait_until(lambda: names() == ["0000-3b-00.0"], timeout=SETTLE,
                          what="the spec rewritten without the removed port")
    [spec] = specs(cdi).values()
    check(spec)
    answer = await node.allocate(RESOURCE, ["0000:3b:00.0"])
    assert list(answer.cdi_devices) == ["b-com.com/accelerator=0000-3b-00.0"]
    assert [d.host_path for d in answer.devices] == ["/dev/dfl-port.0"], "both: DeviceSpecs too"


async def test_an_unwritable_spec_directory_falls_back_to_device_specs(kubelet, plugin,
                                                                     tmp_path):
    fake = FakeNode(tmp_path / "node")
    fake.add_dfl_card("0000:3b:00.0")
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    node = await kubelet("1.32")
    daemon = plugin(extra=["--backend", "intel", "--sysfs-root", str(fake.sysfs_root),
                           "--dev-root", str(fake.dev_root), "--cdi", "--cdi-spec-dir",
                           str(blocker / "cdi"), "--device-list-strategy", "cdi",
                           "--rescan-interval", "0.1"])
    await node.wait_for_devices(RESOURCE, timeout=SETTLE)
    await asyncio.sleep(1.0)  # ten rescans
    answer = await node.allocate(RESOURCE, ["0000:3b:00.0"])
    assert not answer.cdi_devices, "a name the runtime cannot resolve would fail the container"
    assert [d.host_path for d in answer.devices] == ["/dev/dfl-port.0"]
    assert daemon.text().count("cannot write the CDI spec") == 1, "said once, not per scan"
