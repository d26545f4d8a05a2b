"""Whether a device can be given another function on this node: one rule for every reader.

``--programming on`` is the operator's consent; the device must also offer a way in. Today
that is an Intel partial-reconfiguration region whose FPGA Management Engine has a device
node (``/dev/dfl-fme.N`` or ``/dev/intel-fpga-fme.N``: the port-PR ioctl goes through it),
which discovery records as the ``fme_node`` fact. Alveo cards and AWS slots are loaded by
vendor tools (XRT's ``xbutil``, the FPGA SDK's ``fpga-load-local-image``) that this driver
does not run yet, so they are never programmable: a selector must not be told a device can
take a function no loader here could give it. An SR-IOV virtual function has no FME of its
own, so its port is not programmable either.

The DRA inventory publishes the answer as the ``programmable`` attribute and ``discover``
shows it, both through :func:`programmable`, so the two can never disagree.
"""

from __future__ import annotations

from plugin.model.devices import Device

PROGRAMMING_MODES = ("off", "on")
"""Values of ``--programming``."""
FME_NODE = "fme_node"
"""Discovery fact: the host path of the FME device node of an Intel port's card."""
PROGRAMMABLE_FAMILIES = ("intel",)
"""Backends with a loader on this node (see the module docstring)."""


def programmable(device: Device, programming: bool) -> bool:
    """True when programming is on and ``device`` has the way in its family needs."""
    return (programming and device.backend in PROGRAMMABLE_FAMILIES
            and bool(device.attribute(FME_NODE)))
