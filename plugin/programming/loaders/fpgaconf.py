"""Intel ports loaded by OPAE's ``fpgaconf``, for nodes that would rather run Intel's tool.

The command (OFS/opae-sdk ``binaries/fpgaconf/fpgaconf.c`` and
``libraries/argsfilter/argsfilter.c`` at c52aef5aefdacdcc238097e6b8f260f7924f9f04)::

    fpgaconf --segment 0x0000 --bus 0x3b --device 0x00 --function 0x0 <gbs path>

The card is chosen by its PCI address. Current releases take the address either as
``-S/--segment -B/--bus -D/--device -F/--function`` (parsed by ``argsfilter``, values read
by ``strtoul(.., 0)``, hence the ``0x`` prefixes: ``08`` would be bad octal) or as a
positional ``ssss:bb:dd.f``; releases before the argsfilter (``tools/fpgaconf/fpgaconf.c``
at 5c51b12a209ab2bcfaf277b2b04e9054e6942ca4) have no positional address and read ``-S`` as
the socket, but accept the same long options, so the long options are what is passed: one
command line for both. ``argsfilter`` drops each option with the word after it, so each
option and its value are separate words (never ``--bus=0x3b``).

fpgaconf has no port option: it always programs slot 0 (``uint32_t slot_num = 0; /*
currently, we don't support multiple slots */``), so ports other than number 0 are not
offered to it (:meth:`Fpgaconf.unavailable`); the ioctl loader programs any port.

Beyond the ioctl, fpgaconf matches the FME's interface ID itself (``find_fpga`` with the
GBS's ``interface-uuid``), programs the AFU user clocks from the metadata, clears the port's
errors, and refuses a port some process has open (no ``--force``). Its exit status says where
it stopped: 1 arguments, 2 reading the GBS, 3 enumeration, 4 no matching FPGA at that
address ("No suitable slots found."), 5 programming failed or several matches, 6-8 the
properties set from the arguments. Its messages go to stderr and are quoted in the error.

The GBS is checked here first (interface, AFU ID, the pinned digest) as for every loader,
on a sealed in-memory copy that fpgaconf is then given as ``/proc/self/fd/N``
(:mod:`.sealed`): fpgaconf loads exactly the bytes that were checked, whatever happens to
the library file meanwhile.
"""

from __future__ import annotations

from pathlib import Path

from plugin.discovery.backends.pci import parse_bdf
from plugin.programming.loaders.base import LoadJob
from plugin.programming.loaders.checks import checked_gbs_in
from plugin.programming.loaders.tools import in_thread, load_library_image, tool_problem
from value_types.devices import Device

FLAG = "--fpgaconf"
STEP = "fpgaconf"


def fpgaconf_args(pci_address: str, image: str) -> list[str]:
    """fpgaconf's arguments selecting the card at ``pci_address`` (``dddd:bb:dd.f``)."""
    address = parse_bdf(pci_address)
    if address is None:
        raise ValueError(f"{pci_address!r} is not a PCI address")
    return ["--segment", f"0x{address.domain:04x}", "--bus", f"0x{address.bus:02x}",
            "--device", f"0x{address.device:02x}", "--function", f"0x{address.function:x}",
            image]


class Fpgaconf:
    """Intel port loader running OPAE's ``fpgaconf`` (see the module docstring)."""

    name = "fpgaconf"
    family = "intel"

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def unavailable(self, device: Device) -> str | None:
        if device.backend != self.family:
            return f"{device.id}: a {device.backend} device, not an Intel FPGA port"
        if not device.attrs.get("fme_node"):
            return (f"{device.id}: no FPGA Management Engine device node, which fpgaconf "
                    f"needs (a virtual function's port has none)")
        if device.attrs.get("port_number") != "0":
            return (f"{device.id}: fpgaconf programs port 0 of a card only; this is port "
                    f"{device.attrs.get('port_number', '(unknown)')} (use --intel-loader ioctl)")
        if parse_bdf(device.attrs.get("pci_address", "")) is None:
            return f"{device.id}: discovery recorded no PCI address"
        return tool_problem(self.path, FLAG)

    async def loaded(self, device: Device) -> str | None:
        return self.loaded_blocking(device)

    def loaded_blocking(self, device: Device) -> str | None:
        return None  # the port's afu_id, which discovery reads, tells

    async def load(self, job: LoadJob) -> None:
        await in_thread(lambda: self.load_blocking(job))

    def load_blocking(self, job: LoadJob) -> None:
        load_library_image(job, self.unavailable(job.device), checked_gbs_in, self.path,
                           fpgaconf_args, STEP, FLAG)
