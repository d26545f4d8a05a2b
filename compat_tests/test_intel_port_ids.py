"""Intel port IDs against the real ``serve`` process and an emulated kubelet.

A port's ID must not depend on which other ports its PCI function has at the moment: when
port 0 of a two-port function goes (hot-unplug, or released to an SR-IOV virtual function),
the kubelet must see port 0's ID leave and nothing else, never port 1 dropped and added
again under another ID.
"""

from __future__ import annotations

from compat_tests.fake_sysfs import FakeNode
from compat_tests.test_faults_discovery import RESOURCE, SETTLE, intel_flags, stops_promptly

PORT0 = "0000:3b:00.0"
PORT1 = "0000:3b:00.0-port1"
OTHER = "0000:d8:00.0"


async def test_removing_port_zero_of_a_function_leaves_port_one_under_its_id(
    kubelet, plugin, tmp_path,
) -> None:
    fake = FakeNode(tmp_path / "node")
    [zero, one] = fake.add_dfl_card("0000:3b:00.0", ports=2)
    fake.add_dfl_card(OTHER, numa_node=1)
    node = await kubelet("1.26")
    daemon = plugin(extra=intel_flags(fake, "--rescan-interval", "0.2"))
    served = {PORT0, PORT1, OTHER}
    await node.wait_for_devices(
        RESOURCE, lambda d: set(d) == served and all(x.healthy for x in d.values()),
        timeout=SETTLE)
    seen = len(node.lists_received(RESOURCE))

    fake.remove_port(zero)
    await node.wait_for_devices(RESOURCE, lambda d: set(d) != served, timeout=SETTLE)

    lists = node.lists_received(RESOURCE)[seen:]
    assert lists[-1] == [PORT1, OTHER], f"only port 0's ID should have left: {lists}"
    assert all(PORT1 in ids for ids in lists), f"port 1 dropped on the way: {lists}"
    assert node.devices(RESOURCE)[PORT1].healthy
    answer = await node.allocate(RESOURCE, [PORT1])
    assert [d.host_path for d in answer.devices] == [f"/dev/{one}"], "the same port"
    await stops_promptly(daemon)
