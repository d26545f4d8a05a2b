"""Whether a device can be given another function on this node: the words every reader shares.

``--programming on`` is the operator's consent; the device must also offer a way in, which
its family's loader decides (``plugin.programming``): an Intel partial-reconfiguration region
whose FPGA Management Engine has a device node (``/dev/dfl-fme.N`` or
``/dev/intel-fpga-fme.N``: the port-PR ioctl goes through it, recorded by discovery as the
``fme_node`` fact) or OPAE's ``fpgaconf``; an Alveo card with XRT's ``xbutil``; an AWS slot
with the FPGA SDK's tools. An SR-IOV virtual function has no FME of its own, so its port is
not programmable.

The DRA inventory publishes the answer as the ``programmable`` attribute and ``discover``
shows it, both through one :data:`Programmable` rule made by ``plugin.programming.setup``,
so the two can never disagree.
"""

from __future__ import annotations

from collections.abc import Callable

from value_types.devices import Device

PROGRAMMING_MODES = ("off", "on")
PROGRAM_AT = ("prepare", "bind")
"""``--program-at``: when a claim's function is loaded (before its pod binds, or at prepare)."""
"""Values of ``--programming``."""
INTEL_LOADERS = ("ioctl", "fpgaconf")
"""Values of ``--intel-loader``."""
DEFAULT_MAX_IMAGE_BYTES = 512 * 1024 * 1024
"""``--image-max-bytes``: the largest image file read (a big Agilex GBS is about 100 MiB)."""
FME_NODE = "fme_node"
"""Discovery fact: the host path of the FME device node of an Intel port's card."""

Programmable = Callable[[Device], bool]
"""Whether a device can be given another function on this node."""
WhyNot = Callable[[Device], "str | None"]
"""Why a device cannot be given another function on this node (None: it can)."""
OFF = "programming is off on this node (--programming on enables it)"


def never(device: Device) -> bool:
    """The rule while programming is off: no device is programmable."""
    return False


def never_why(device: Device) -> str:
    return OFF
