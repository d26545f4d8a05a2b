"""Kubernetes resource quantities: parsed as the API server parses them, written back canonical.

A server never stores the string a client sent: ``"1024Mi"`` reads back as ``"1Gi"``, ``"0.5"`` as
``"500m"``, ``4`` (a JSON number) as ``"4"``. A driver that compares what it published with what
it reads back must compare quantities semantically or it republishes forever, so the emulator
canonicalizes exactly as apimachinery ``pkg/api/resource/quantity.go`` (ParseQuantity,
CanonicalizeBytes) and ``amount.go`` do: values round up to a multiple of 1e-9, decimal forms
use the largest exponent that is a multiple of 3, binary forms the largest power of 1024.
"""

from __future__ import annotations

import re
from fractions import Fraction

SPLIT_RE = "^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
FORMAT_ERROR = f"quantities must match the regular expression '{SPLIT_RE}'"

_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DECIMAL_BY_EXP = {exp: suffix for suffix, exp in _DECIMAL.items()}
_BINARY_BY_EXP = {exp: suffix for suffix, exp in _BINARY.items()}
_NANO = Fraction(1, 10**9)
_MAX_BINARY = Fraction(2**63 - 1)


class QuantityError(ValueError):
    """The server's own wording for a quantity it cannot parse."""


def _parse(text: str) -> tuple[Fraction, str]:
    """(exact value, format) where format is "DecimalSI", "BinarySI" or "DecimalExponent"."""
    if text == "0":
        return Fraction(0), "DecimalSI"
    match = re.match(SPLIT_RE, text)
    if not text or match is None:
        raise QuantityError(FORMAT_ERROR)
    number, suffix = match.groups()
    if number.count(".") > 1 or number.strip("+-") in ("", "."):
        raise QuantityError("unable to parse numeric part of quantity")
    value = Fraction(number)
    if suffix in _BINARY:
        value, fmt = value * 2 ** _BINARY[suffix], "BinarySI"
    elif suffix in _DECIMAL:
        value, fmt = value * Fraction(10) ** _DECIMAL[suffix], "DecimalSI"
    elif suffix[:1] in ("e", "E") and re.fullmatch(r"[-+]?[0-9]+", suffix[1:]):
        value, fmt = value * Fraction(10) ** int(suffix[1:]), "DecimalExponent"
    else:
        raise QuantityError("unable to parse quantity's suffix")
    if value:
        # Round away from zero to a multiple of 1e-9 (inf.RoundUp at Nano scale).
        units = value / _NANO
        whole = -(-abs(units).numerator // abs(units).denominator)
        value = Fraction(whole if value > 0 else -whole) * _NANO
    if fmt == "BinarySI" and abs(value) > _MAX_BINARY:
        value = _MAX_BINARY if value > 0 else -_MAX_BINARY
    if fmt == "BinarySI" and 0 < abs(value) < 1:
        fmt = "DecimalSI"
    return value, fmt


def parse(raw: object) -> Fraction:
    """The exact value of a quantity given as a JSON string or number; QuantityError if bad."""
    return _parse(_text(raw))[0]


def _text(raw: object) -> str:
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        raise QuantityError(FORMAT_ERROR)
    return raw if isinstance(raw, str) else repr(raw)


def canonical(raw: object) -> str:
    """The string the server writes back for a quantity (``"1024Mi"`` -> ``"1Gi"``)."""
    value, fmt = _parse(_text(raw))
    if value == 0:
        return "0"
    if fmt == "BinarySI":
        if -1024 < value < 1024 or value.denominator != 1:
            fmt = "DecimalSI"
        else:
            amount, exponent = int(value), 0
            while amount % 1024 == 0 and exponent < 6:
                amount //= 1024
                exponent += 1
            return f"{amount}{_BINARY_BY_EXP.get(exponent * 10, '')}"
    # Decimal: integer mantissa, exponent a multiple of 3, as large as possible.
    exponent = -9
    mantissa = value / Fraction(10) ** exponent
    while mantissa.denominator == 1 and mantissa.numerator % 10 == 0 and mantissa != 0:
        mantissa /= 10
        exponent += 1
    while exponent % 3:
        mantissa *= 10
        exponent -= 1
    number = str(mantissa.numerator)
    if fmt == "DecimalExponent":
        return number + (f"e{exponent}" if exponent else "")
    if exponent in _DECIMAL_BY_EXP:
        return number + _DECIMAL_BY_EXP[exponent]
    return f"{number}e{exponent}"
