"""What a flag's value, variable or file entry must be, turned into the setting's type.

Each converter raises :class:`argparse.ArgumentTypeError` with the reason, so a bad value
from any source exits 2 with one line naming the flag (:mod:`plugin.cli.sources` reports a
variable's or the file's the same way).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from plugin.cli.settings import DEFAULT_GENERATIONS
from plugin.model.replicas import Replicas, parse_replicas
from plugin.model.resource_names import dns_subdomain_problem, resource_name_problem
from value_types.pool import is_dns_label

if TYPE_CHECKING:
    from plugin.serving.dra.share_setting import FamilyShare


@dataclass(frozen=True)
class Seconds:
    """A duration flag's converter: a finite number of seconds within ``[low, high]``.

    ``nan`` and ``inf`` parse as floats but make no duration (``--register-timeout nan``
    never registered), and an interval of a nanosecond turns a re-read into a busy loop, so
    every duration is finite and bounded; the bounds are shown in each flag's help.
    """

    low: float
    high: float

    def __call__(self, text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number of seconds")
        if not self.low <= value <= self.high:
            raise argparse.ArgumentTypeError(
                f"{text!r} must be between {self.low:g} and {self.high:g} seconds")
        return value

    def describe(self) -> str:
        return f"{self.low:g} to {self.high:g}"


INTERVAL = Seconds(0.1, 3600)
HEALTH_INTERVAL = Seconds(0.05, 60)
TIMEOUT = Seconds(0.1, 300)
BACKOFF = Seconds(0.01, 300)
MAX_AGE = Seconds(1, 86400)
PROGRAM_TIMEOUT = Seconds(1, 3600)


def whole_number(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 0 <= value <= 4096:
        raise argparse.ArgumentTypeError(f"{text!r} must be between 0 and 4096")
    return value


def byte_count(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of bytes") from None
    if not 4096 <= value <= 1 << 40:
        raise argparse.ArgumentTypeError(f"{text!r} must be between 4096 and {1 << 40}")
    return value


def port_number(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} must be between 1 and 65535")
    return value


def generations(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in DEFAULT_GENERATIONS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected a comma-separated list of {', '.join(DEFAULT_GENERATIONS)}"
        )
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"{text!r} names a generation twice")
    return names


def socket_name(text: str) -> str:
    if not text or "/" in text or text in (".", "..") or text == "kubelet.sock":
        raise argparse.ArgumentTypeError(
            f"{text!r} must be a plain file name other than kubelet.sock"
        )
    return text


def resource_name(text: str) -> str:
    problem = resource_name_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def dns_subdomain(text: str) -> str:
    """A node or DRA driver name: what the API server accepts for either."""
    problem = dns_subdomain_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def dns_label(text: str) -> str:
    """A namespace name (``--function-grants``)."""
    if not is_dns_label(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a namespace name (a lowercase DNS "
                                         "label of at most 63 characters)")
    return text


def class_names(text: str) -> tuple[str, ...]:
    """``--guarded-classes``: DeviceClass names, comma-separated."""
    names = tuple(sorted({n.strip() for n in text.split(",") if n.strip()}))
    for name in names:
        problem = dns_subdomain_problem(name)
        if problem:
            raise argparse.ArgumentTypeError(f"DeviceClass {name!r}: {problem}")
    return names


def driver_name(text: str) -> str:
    text = dns_subdomain(text)
    if len(text) > 63:
        raise argparse.ArgumentTypeError(f"{text!r} is longer than the 63 characters a DRA "
                                         "driver name may have")
    return text


def resource_prefix(text: str) -> str:
    from plugin.model.resources import prefix_problem

    problem = prefix_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def replicas(text: str) -> Replicas:
    try:
        return parse_replicas(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def shares(text: str) -> tuple[FamilyShare, ...]:
    """``--dra-share``: see :mod:`plugin.serving.dra.share_setting` (imported when a value
    is read, so parsing another command's settings loads no serving code)."""
    from plugin.serving.dra.share_setting import parse_shares

    try:
        return parse_shares(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def boolean(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not true or false")
