"""AFU and interface IDs in one spelling, so equal IDs compare equal whatever the driver printed.

Drivers print these 128-bit IDs as 32 hex digits, tools and users as UUIDs with dashes,
sometimes in upper case. Resources in ``afu`` mode are keyed on the AFU ID, so two
spellings of one ID must never become two resources.
"""

from __future__ import annotations

import re

_HEX = re.compile(r"^[0-9a-f]{1,64}$")
UUID_DIGITS = 32
DASHED_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
                         re.IGNORECASE)
"""A UUID as ``uuid_unparse`` writes it (8-4-4-4-12 hex digits); match with ``fullmatch``."""


def normalise_hex_id(text: str) -> str | None:
    """Lowercase hex digits without ``0x`` or dashes; None if ``text`` is not such an ID."""
    value = text.strip().lower()
    if value.startswith("0x"):
        value = value[2:]
    value = value.replace("-", "")
    return value if _HEX.match(value) else None


def uuid_hex(text: str) -> str | None:
    """A 128-bit ID as 32 lowercase hex digits, from any spelling; None if it is not one."""
    value = normalise_hex_id(text)
    return value if value is not None and len(value) == UUID_DIGITS else None


def is_all_f(hex_id: str) -> bool:
    """True for the all-ones AFU ID the port reports after the firmware crashed."""
    return set(hex_id) == {"f"}
