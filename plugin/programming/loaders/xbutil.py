"""Alveo cards loaded by XRT's ``xbutil program``.

The command (Xilinx/XRT ``src/runtime_src/core/tools/xbutil2/SubCmdProgram.cpp`` at
67ecb0c862eec7bc4e71b805aa68af2b4fd8da79, the commit that last changed it in the snapshot at
963c58ee224491e191b3be78d76f51e55e152177)::

    xbutil program --device 0000:17:00.1 --user /var/lib/accelerator-images/f.xclbin

``--device``/``-d`` is the user function's ``Bus:Device.Function`` (``get_device(..,
inUserDomain=true)``), ``--user``/``-u`` the xclbin. On success it prints
``INFO: xrt-smi program succeeded on <bdf>`` (``xbutil`` became ``xrt-smi``; the
``xbutil`` name remains in installed trees) and exits 0; on failure it prints
``ERROR: ...`` and exits 1 (``xbutil.cpp`` ``main``). XRT checks the image against the
shell itself; this loader checks first, so a wrong image is refused without running the
tool: the xclbin's UUID must be the requested one, and when the image names a PR interface
the shell's ``interface_uuids`` must include it. XRT is given the sealed in-memory copy
of the checked bytes as ``/proc/self/fd/N`` (:mod:`.sealed`), never the library path.
"""

from __future__ import annotations

from pathlib import Path

from plugin.discovery.backends.pci import parse_bdf
from plugin.programming.loaders.base import LoadJob
from plugin.programming.loaders.checks import checked_xclbin_in
from plugin.programming.loaders.tools import in_thread, load_library_image, tool_problem
from value_types.devices import Device

FLAG = "--xbutil"
STEP = "xbutil program"


def xbutil_args(pci_address: str, image: str) -> list[str]:
    """``xbutil``'s arguments loading ``image`` onto the user function ``pci_address``."""
    return ["program", "--device", pci_address, "--user", image]


class Xbutil:
    """Alveo loader running XRT's ``xbutil program`` (see the module docstring)."""

    name = "xbutil"
    family = "alveo"

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def unavailable(self, device: Device) -> str | None:
        if device.backend != self.family:
            return f"{device.id}: a {device.backend} device, not an Alveo card"
        if parse_bdf(device.attrs.get("pci_address", "")) is None:
            return f"{device.id}: discovery recorded no PCI address"
        return tool_problem(self.path, FLAG)

    async def loaded(self, device: Device) -> str | None:
        return self.loaded_blocking(device)

    def loaded_blocking(self, device: Device) -> str | None:
        return None  # xocl's xclbinuuid, which discovery reads, tells

    async def load(self, job: LoadJob) -> None:
        await in_thread(lambda: self.load_blocking(job))

    def load_blocking(self, job: LoadJob) -> None:
        load_library_image(job, self.unavailable(job.device), checked_xclbin_in, self.path,
                           xbutil_args, STEP, FLAG)
