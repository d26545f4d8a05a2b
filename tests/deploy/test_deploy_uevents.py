"""Why the DaemonSet has no hostNetwork: uevents reach a pod's own network namespace.

Since Linux 4.18 the kernel broadcasts uevents of devices that carry no namespace tag (PCI
functions, FPGA ports and regions, everything but network devices) into every network
namespace owned by the initial user namespace, which is where an ordinary pod's namespace
lives (it would not be with ``hostUsers: false``). This test shows it on the running kernel,
with the plugin's own listener, in the conditions of the DaemonSet: a fresh network
namespace, no capability at all, no_new_privs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from deploy_support import REPO

from tests.system_tools import UTIL_LINUX, needs_tool

TRIGGER = Path("/sys/devices/virtual/mem/null/uevent")
LISTENER = """
import asyncio, sys
from plugin.discovery.monitor import LISTENING
from plugin.discovery.uevents import kernel_uevents

async def main():
    async for description in kernel_uevents(("mem",)):
        if description == LISTENING:  # bound: a uevent from now on is received
            print("listening", flush=True)
            continue
        print(description, flush=True)
        return

asyncio.run(asyncio.wait_for(main(), 15))
"""


def test_a_capability_free_process_in_its_own_network_namespace_gets_device_uevents():
    if os.geteuid() != 0:
        pytest.skip("needs root to create a network namespace and trigger a uevent")
    for tool in ("unshare", "setpriv"):
        needs_tool(tool, UTIL_LINUX)
    if not os.access(TRIGGER, os.W_OK):
        pytest.skip(f"{TRIGGER} is not writable here")
    probe = subprocess.run(["unshare", "--net", "true"], capture_output=True, text=True,
                           timeout=30, check=False)
    if probe.returncode != 0:
        pytest.skip(f"cannot create a network namespace: {probe.stderr.strip()}")
    own_netns = os.readlink("/proc/self/ns/net")
    listener = subprocess.Popen(
        ["unshare", "--net", "setpriv", "--no-new-privs", "--inh-caps=-all",
         "--bounding-set=-all", sys.executable, "-c",
         "import os; print(os.readlink('/proc/self/ns/net'), flush=True); "
         "print(open('/proc/self/status').read().split('CapEff:')[1].split()[0], flush=True)"
         + LISTENER],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
    )
    try:
        assert listener.stdout is not None
        netns = listener.stdout.readline().strip()
        assert netns.startswith("net:") and netns != own_netns
        assert int(listener.stdout.readline(), 16) == 0, "the listener kept a capability"
        assert listener.stdout.readline().strip() == "listening"
        time.sleep(0.3)
        TRIGGER.write_text("change\n")
        out, err = listener.communicate(timeout=20)
    finally:
        if listener.poll() is None:
            listener.kill()
            listener.wait(5)
    assert listener.returncode == 0, err
    assert "change mem null" in out
