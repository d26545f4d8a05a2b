"""128-bit function and interface IDs in the one spelling the kernel's sysfs uses.

The DFL kernel prints a port's ``afu_id`` and a region's ``compat_id`` as 32 hex digits
(``"%016llx%016llx\\n"``, high then low half: ``drivers/fpga/dfl-afu-main.c``,
``drivers/fpga/fpga-region.c``); OPAE's out-of-tree ``intel-fpga`` driver prints the FME's
``pr/interface_id`` the same way (``fme-pr.c``, ``interface_id_show``), and XRT's
``interface_uuids``/``logic_uuids`` are 32 hex digits too (its ``xclbinuuid`` is dashed).
Image metadata writes the same 16 bytes as dashed UUIDs (``uuid_parse`` order: the string's
hex digits in order), so dropping the dashes and lower-casing makes both sides comparable,
and a ``compat_id`` printed dashed (a kernel change once proposed ``%pU``) reads the same.
"""

from __future__ import annotations

from plugin.discovery.backends.hexid import DASHED_UUID, uuid_hex


def uuid_text_to_id(text: object, what: str) -> str:
    """A metadata UUID (dashed, as ``uuid_parse`` accepts it) as 32 lower-case hex digits.

    Raises ValueError naming ``what`` when the value is not such a string.
    """
    if not isinstance(text, str):
        raise ValueError(f"{what} is not a string: {type(text).__name__}")
    if not DASHED_UUID.fullmatch(text):
        raise ValueError(f"{what} {text[:60]!r} is not a UUID (8-4-4-4-12 hex digits)")
    return text.replace("-", "").lower()


def sysfs_id(text: str | None) -> str | None:
    """A 128-bit ID as sysfs or a user wrote it (dashes, case, ``0x``, newline), normalised.

    None when ``text`` is not 32 hex digits once normalised, so an unreadable or garbled
    attribute never compares equal to anything.
    """
    if text is None:
        return None
    return uuid_hex(text)


def same_id(image_id: str, sysfs_text: str | None) -> bool:
    """True when the sysfs attribute holds ``image_id`` (already normalised)."""
    return sysfs_id(sysfs_text) == image_id


def dashed(hex_id: str) -> str:
    """32 hex digits as the 8-4-4-4-12 UUID users and vendor tools print."""
    h = hex_id
    return f"{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
