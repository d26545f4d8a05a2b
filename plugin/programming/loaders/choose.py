"""The loaders a ``serve`` process offers, one per device family, from its flags."""

from __future__ import annotations

from pathlib import Path

from plugin.programming.loaders.aws import AwsFpgaSdk
from plugin.programming.loaders.base import LocalLoader
from plugin.programming.loaders.fpgaconf import Fpgaconf
from plugin.programming.loaders.intel_pr import PortPrIoctl
from plugin.programming.loaders.xbutil import Xbutil

INTEL_LOADERS = ("ioctl", "fpgaconf")
"""Values of ``--intel-loader``."""


def loaders(*, intel: str, dev_root: Path, fpgaconf: Path, xbutil: Path, aws_load: Path,
            aws_describe: Path) -> dict[str, LocalLoader]:
    """``{family: loader}`` for Intel (``intel`` picks which), Alveo and AWS.

    Building them touches nothing: a missing tool shows per device, through
    :meth:`Loader.unavailable`, when a load is asked for.
    """
    intel_loader: LocalLoader
    if intel == "ioctl":
        intel_loader = PortPrIoctl(dev_root)
    elif intel == "fpgaconf":
        intel_loader = Fpgaconf(fpgaconf)
    else:
        raise ValueError(f"--intel-loader {intel!r}: expected one of "
                         f"{', '.join(INTEL_LOADERS)}")
    chosen: list[LocalLoader] = [intel_loader, Xbutil(xbutil), AwsFpgaSdk(aws_load, aws_describe)]
    return {loader.family: loader for loader in chosen}
