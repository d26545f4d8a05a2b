"""AWS F1/F2 slots loaded by the FPGA SDK's ``fpga-load-local-image``.

The commands (aws/aws-fpga ``sdk/userspace/fpga_mgmt_tools/src/fpga_local_cmd_parse.c``
and ``fpga_local_cmd.c`` at fd77a7276ed2e236ed842bae344a2affcad5ae4a, the ``f2`` branch;
``master`` at 4123ef3456ca5c1d58ad2269bb71dc3d1914149b parses the same options; usage in
``sdk/userspace/fpga_mgmt_tools/README.md``)::

    fpga-load-local-image -S <slot> -I agfi-0123456789abcdef0 -H
    fpga-describe-local-image -S <slot> -H

``-S`` is the logical slot (``fpga-describe-local-image-slots`` order, which discovery's
``slot`` attribute follows: :mod:`plugin.discovery.backends.aws`), ``-I`` the AGFI, ``-H``
prints column headers. Without ``-A`` the load is synchronous on F1 and F2 alike: the tool
waits for the slot to report ``loaded``, removes and rescans the application function so
its new PCI IDs show, then prints the slot's state. No F2-only flag is needed.
``describe`` is run without ``-R``: its rescan removes the application function from
the PCI tree (unbinding its driver), which a query must not do; the synchronous load
already rescanned.

Both print the slot's state as ``fpga_local_cmd.c`` ``cli_show_image_info`` formats it
(runs of spaces shortened here; the parser splits on any whitespace)::

    Type  FpgaImageSlot  FpgaImageId  StatusName  StatusCode  ErrorName  ErrorCode  ShVersion
    AFI          0       agfi-0fedcba9876543210  loaded  0  ok  0  0x04261818
    Type  FpgaImageSlot  VendorId    DeviceId    DBDF
    AFIDEVICE    0       0x1d0f      0x9048      0000:34:00.0

The image ID column reads ``none`` (or ``No AFI`` in the README's examples) on a cleared
slot; status names come from ``FPGA_STATUS2STR`` (``loaded``, ``cleared``, ``busy``,
``not-programmed``, ``load-failed``...). On failure the tools print
``Error: (<code>) <name>`` and exit non-zero. A load is accepted only when the tool exits
0 *and* its output shows the slot ``loaded`` with the requested AGFI.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from plugin.programming.loaders.base import LoadFailed, LoadJob
from plugin.programming.loaders.tools import (
    ToolOutput,
    failure,
    in_thread,
    run_tool_blocking,
    tool_problem,
)
from value_types.devices import Device

LOAD_FLAG = "--fpga-load-local-image"
DESCRIBE_FLAG = "--fpga-describe-local-image"
LOAD_STEP = "fpga-load-local-image"
DESCRIBE_STEP = "fpga-describe-local-image"
DESCRIBE_TIMEOUT = 30.0
AGFI = re.compile(r"agfi-[0-9a-f]{17}")
_AFI_LINE = re.compile(
    r"^AFI\s+(?P<slot>\d+)\s+(?P<id>.+?)\s+(?P<status>\S+)\s+(?P<code>-?\d+)\s+"
    r"(?P<error>\S+)\s+(?P<error_code>-?\d+)\s+(?P<shell>0x[0-9a-fA-F]+)\s*$")


@dataclass(frozen=True)
class SlotState:
    """One ``AFI`` line of the tools' output."""

    slot: int
    agfi: str | None
    status: str
    error: str


def parse_slot_state(text: str, slot: int) -> SlotState | None:
    """The state of ``slot`` from a tool's output; None when no ``AFI`` line names it."""
    for line in text.splitlines():
        match = _AFI_LINE.match(line.strip())
        if match is None or int(match["slot"]) != slot:
            continue
        image = match["id"].strip().lower()
        return SlotState(slot, image if AGFI.fullmatch(image) else None, match["status"],
                         match["error"])
    return None


class AwsFpgaSdk:
    """AWS slot loader running the FPGA SDK's management tools (see the module docstring)."""

    name = "fpga-load-local-image"
    family = "aws"

    def __init__(self, load: Path, describe: Path) -> None:
        self.load_tool = Path(load)
        self.describe_tool = Path(describe)

    def unavailable(self, device: Device) -> str | None:
        if device.backend != self.family:
            return f"{device.id}: a {device.backend} device, not an AWS FPGA slot"
        if not device.attrs.get("slot", "").isdigit():
            return f"{device.id}: discovery recorded no slot number"
        return (tool_problem(self.load_tool, LOAD_FLAG)
                or tool_problem(self.describe_tool, DESCRIBE_FLAG))

    async def loaded(self, device: Device) -> str | None:
        return await in_thread(lambda: self.loaded_blocking(device))

    def loaded_blocking(self, device: Device) -> str | None:
        """The AGFI the slot holds (lower-case) when it reports ``loaded``, else None."""
        problem = self.unavailable(device)
        if problem is not None:
            raise LoadFailed(DESCRIBE_STEP, problem, touched=False)
        slot = int(device.attrs["slot"])
        output = run_tool_blocking(self.describe_tool, ["-S", str(slot), "-H"],
                                   step=DESCRIBE_STEP, flag=DESCRIBE_FLAG,
                                   timeout=DESCRIBE_TIMEOUT)
        if output.returncode != 0:
            raise LoadFailed(DESCRIBE_STEP, failure(self.describe_tool, output),
                             touched=False)
        state = self._state(output, slot, DESCRIBE_STEP, self.describe_tool, touched=False)
        return state.agfi if state.status == "loaded" else None

    async def load(self, job: LoadJob) -> None:
        await in_thread(lambda: self.load_blocking(job))

    def load_blocking(self, job: LoadJob) -> None:
        device = job.device
        problem = self.unavailable(device)
        if problem is not None:
            raise LoadFailed(LOAD_STEP, problem, touched=False)
        if job.sha256 is not None:
            raise LoadFailed(LOAD_STEP, f"{device.id}: an AFI is loaded by its ID from AWS, "
                                        "not from bytes on this node, so a sha256 cannot be "
                                        "checked; pin the AGFI alone", touched=False)
        agfi = job.function_id.strip().lower()
        if not AGFI.fullmatch(agfi):
            raise LoadFailed(LOAD_STEP, f"{device.id}: {job.function_id!r} is not an AGFI "
                                        f"(agfi- and 17 hex digits)", touched=False)
        slot = int(device.attrs["slot"])
        output = run_tool_blocking(self.load_tool, ["-S", str(slot), "-I", agfi, "-H"],
                                   step=LOAD_STEP, flag=LOAD_FLAG, timeout=job.timeout)
        if output.returncode != 0:
            raise LoadFailed(LOAD_STEP, failure(self.load_tool, output))
        state = self._state(output, slot, LOAD_STEP, self.load_tool, touched=True)
        if state.status != "loaded" or state.agfi != agfi:
            raise LoadFailed(LOAD_STEP, f"{device.id}: slot {slot} reports "
                                        f"{state.agfi or 'no AFI'} {state.status} "
                                        f"({state.error}) after loading {agfi}")

    @staticmethod
    def _state(output: ToolOutput, slot: int, step: str, tool: Path,
               touched: bool) -> SlotState:
        state = parse_slot_state(output.stdout, slot)
        if state is None:
            raise LoadFailed(step, f"{tool.name} printed no state for slot {slot}: "
                                   f"{output.tail()}", touched=touched)
        return state
