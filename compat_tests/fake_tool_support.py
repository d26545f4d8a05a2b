"""What every stand-in vendor tool does alike: report on stderr, read numbers as C's
``strtoul(.., 0)`` does, match a PCI address, and take the time a load is set to take.
"""

from __future__ import annotations

import re
import sys
import time

SBDF = re.compile(r"^(([0-9a-fA-F]{4}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")


def err(*lines: str) -> None:
    for line in lines:
        print(line, file=sys.stderr)


def strtoul(text: str) -> int | None:
    """C ``strtoul(text, &end, 0)`` that must consume the whole string."""
    try:
        if text.lower().startswith("0x"):
            return int(text[2:], 16)
        if text.startswith("0") and len(text) > 1:
            return int(text[1:], 8)
        return int(text, 10)
    except ValueError:
        return None


def pause(config: dict[str, object]) -> None:
    delay = float(str(config["delay"]))
    if delay:
        time.sleep(delay)
