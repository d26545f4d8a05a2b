"""``--dra-share``: which device families the DRA driver publishes for sharing, and how widely.

The admin says it per family (``--dra-share intel=image,alveo=4``), on the driver rather than
in a DeviceClass, because slices are published before any claim exists and the driver sees a
class's configuration only at prepare. A family's value is

* ``image``: as many contexts as the image of the function the device holds says it serves
  (a GBS's ``total-contexts``, an xclbin's compute units), known only for what this driver
  loaded (:mod:`plugin.serving.dra.sharing`);
* ``N`` (a whole number, at least 1): N contexts whatever the image says; 1 is not shared;
* ``off``: not shared, every family's default.

Only Intel ports (OPAE opens an AFU shared, ``FPGA_OPEN_SHARED``) and Alveo cards (XRT runs
several processes on one loaded xclbin) can be shared. A setting for AWS slots or units, for
a family this driver does not know, or that cannot be read, is refused at start in one line
naming the family and why: a sharing the admin asked for and did not get would be found only
when pods land on the same device.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

log = logging.getLogger(__name__)

IMAGE = "image"
OFF = "off"
SHAREABLE = ("intel", "alveo")
"""Families whose loaded function several processes can use at once."""
UNSHAREABLE = ("aws", "units")
MAX_CONTEXTS = 4096
"""Far above any image's context or compute-unit count; a bound, so a typo (an extra
digit or ten) is refused rather than published."""
_NUMBER = re.compile(r"^[0-9]{1,9}$")


@dataclass(frozen=True)
class FamilyShare:
    """One family's sharing: ``contexts`` None for ``image``, 0 for ``off``, else N."""

    family: str
    contexts: int | None

    def __str__(self) -> str:
        shown = IMAGE if self.contexts is None else OFF if self.contexts == 0 else self.contexts
        return f"{self.family}={shown}"


def parse_shares(text: str) -> tuple[FamilyShare, ...]:
    """``FAMILY=VALUE[,FAMILY=VALUE]`` as :class:`FamilyShare` values; ValueError naming the
    family and the problem for anything else. An empty text shares nothing."""
    shares: list[FamilyShare] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        family, equals, value = (s.strip() for s in item.partition("="))
        if not equals or not family:
            raise ValueError(f"{item!r} is not FAMILY=VALUE (e.g. intel=image,alveo=4)")
        family = family.lower()
        if family in UNSHAREABLE:
            raise ValueError(f"{family} devices cannot be shared: only {' and '.join(SHAREABLE)} "
                             "can (an Intel port's AFU opened shared, an Alveo card's xclbin "
                             f"used by several XRT processes); remove {family}={value}")
        if family not in SHAREABLE:
            raise ValueError(f"{family!r} is not a device family this driver knows "
                             f"({', '.join((*SHAREABLE, *UNSHAREABLE))}); only "
                             f"{' and '.join(SHAREABLE)} can be shared")
        if any(s.family == family for s in shares):
            raise ValueError(f"{family} is given twice")
        shares.append(FamilyShare(family, _contexts(family, value)))
    return tuple(shares)


def _contexts(family: str, value: str) -> int | None:
    word = value.lower()
    if word == IMAGE:
        return None
    if word == OFF:
        return 0
    if not _NUMBER.match(word):
        raise ValueError(f"{family}={value}: expected {IMAGE}, {OFF} or a number of contexts "
                         "(1 or more)")
    number = int(word)
    if not 1 <= number <= MAX_CONTEXTS:
        raise ValueError(f"{family}={value}: the number of contexts must be between 1 and "
                         f"{MAX_CONTEXTS} ({OFF} shares nothing)")
    return number


def setting_of(shares: tuple[FamilyShare, ...], family: str) -> int | None:
    """What ``shares`` says for ``family``: None for ``image``, 0 when not shared (``off``,
    not named, or 1 context), else the number of contexts."""
    found = next((s for s in shares if s.family == family), None)
    if found is None or found.contexts == 1:
        return 0
    return found.contexts


def sharing_on(shares: tuple[FamilyShare, ...]) -> bool:
    """Whether any family may be published shared at all."""
    return any(setting_of(shares, s.family) != 0 for s in shares)


def announce(shares: tuple[FamilyShare, ...], api: str) -> None:
    """Say at start that sharing cannot happen where the node is never served through DRA:
    the setting would otherwise be found doing nothing only when pods do not share."""
    if api == "device-plugin" and sharing_on(shares):
        log.warning("--dra-share has no effect with --api device-plugin: it applies to the DRA "
                    "driver only (the device plugin shares devices through --replicas)")
