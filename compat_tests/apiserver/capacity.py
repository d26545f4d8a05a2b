"""Consumable capacity (KEP-5075) as the 1.36 scheduler's allocator counts it.

Read from k8s.io/dynamic-resource-allocation ``structured/internal/incubating/
consumable_capacity.go`` at kubernetes/kubernetes commit
10cd7f609f9454ca055a991ac1e1e251d64020cb (the allocator a 1.36 scheduler runs with the beta
gate on; ``experimental/consumable_capacity.go`` at commit
74f8fbd72409a0d183b6df790ae6098b254b5dc5 has the same rules), with the API's own wording in
the 1.36 OpenAPI schema (``CapacityRequirements.requests``, ``DeviceCapacity.requestPolicy``):

* what a request consumes of one capacity (``calculateConsumedCapacity``): when the request
  does not name it, the policy's ``default``, or the whole ``value`` without a policy (the
  device is claimed whole); when it does, the amount rounded up by the policy: below
  ``validRange.min`` to ``min``, then up to ``min`` plus a multiple of ``step``; with
  ``validValues`` to the first value not below it; without a policy, as asked;
* the policy refuses (``violatesPolicy``) an amount over ``validRange.max``, off the ``step``
  grid, or above every ``validValues`` entry, unless it is the ``default``;
* ``CmpRequestOverCapacity``: a request naming a capacity the device does not publish
  (matched by exact key in this release) does not fit that device; otherwise every capacity
  of the device is counted, and what other shares hold plus what this allocation already
  gave plus this amount must not pass ``value``.

Step arithmetic takes each quantity's ``Value()``, the integer rounded up, as the 1.36 code
does (fractional steps are handled in milli units only by later releases).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from compat_tests.apiserver import quantity as quantities

Amounts = dict[str, Fraction]
Taken = dict[str, tuple[Fraction, str]]
"""What a share takes per capacity: the amount and the quantity written for it."""


def _value(raw: Any) -> int:
    """``resource.Quantity.Value()``: the quantity rounded up to an integer."""
    return math.ceil(quantities.parse(raw))


def _go_mod(a: int, b: int) -> int:
    """Go's ``%`` (truncated towards zero), which Python's differs from for negatives."""
    return a - b * int(a / b) if b else 0


def consumed(requested: str | None, capacity: Mapping[str, Any]) -> tuple[Fraction, str]:
    """What a request asking ``requested`` (None: not named) takes of one capacity: the
    amount, and the quantity the scheduler writes for it (it copies the quantity it took the
    amount from, keeping its format; a step rounding writes a binary-SI integer)."""
    policy = capacity.get("requestPolicy")
    if requested is None:
        if policy and policy.get("default") is not None:
            return _amount(policy["default"])
        return _amount(capacity["value"])
    asked = _amount(requested)
    if not policy:
        return asked
    valid_range = policy.get("validRange")
    if valid_range and valid_range.get("min") is not None:
        low = _amount(valid_range["min"])
        if asked[0] < low[0]:
            return low
        if valid_range.get("step") is None:
            return asked
        step, start = _value(valid_range["step"]), _value(valid_range["min"])
        added = math.ceil(asked[0]) - start
        steps = int(added / step) + (1 if _go_mod(added, step) else 0)
        total = start + step * steps
        return Fraction(total), _binary(total)
    if policy.get("validValues") is not None:
        for valid in policy["validValues"]:
            if asked[0] <= quantities.parse(valid):
                return _amount(valid)
    return asked


def _amount(raw: Any) -> tuple[Fraction, str]:
    return quantities.parse(raw), quantities.canonical(raw)


def _binary(total: int) -> str:
    """``resource.NewQuantity(total, BinarySI)`` as the server stores it."""
    return quantities.canonical(f"{total // 1024}Ki" if total and total % 1024 == 0
                                else str(total))


def violates_policy(amount: Fraction, policy: Mapping[str, Any] | None) -> bool:
    """Whether ``amount`` is outside what the capacity's policy accepts."""
    if not policy:
        return False
    if policy.get("default") is not None and amount == quantities.parse(policy["default"]):
        return False
    valid_range = policy.get("validRange")
    if valid_range is not None:
        if valid_range.get("max") is not None and amount > quantities.parse(valid_range["max"]):
            return True
        if valid_range.get("step") is not None:
            added = math.ceil(amount) - _value(valid_range.get("min", "0"))
            return _go_mod(added, _value(valid_range["step"])) != 0
        return False
    values = policy.get("validValues") or []
    return bool(values) and all(amount != quantities.parse(v) for v in values)


def requested(exact: Mapping[str, Any]) -> dict[str, str] | None:
    """``exactly.capacity.requests`` as written; None when the request names none."""
    requests = (exact.get("capacity") or {}).get("requests")
    return None if requests is None else {name: str(v) for name, v in requests.items()}


def fits(device: Mapping[str, Any], asked: Mapping[str, str] | None,
         held: Amounts) -> Taken | None:
    """What the request takes of every capacity of ``device`` when it fits beside ``held``
    (what shares already hold, by capacity name); None when it does not fit."""
    capacities = device.get("capacity") or {}
    if asked is not None and any(name not in capacities for name in asked):
        return None
    taken: Taken = {}
    for name, capacity in capacities.items():
        amount = consumed(None if asked is None else asked.get(name), capacity)
        if violates_policy(amount[0], capacity.get("requestPolicy")):
            return None
        if held.get(name, Fraction(0)) + amount[0] > quantities.parse(capacity["value"]):
            return None
        taken[name] = amount
    return taken


def add(total: Amounts, amounts: Mapping[str, Any]) -> None:
    """Add quantities (strings as stored, or ``(amount, text)`` pairs) into ``total``."""
    for name, amount in amounts.items():
        value = amount[0] if isinstance(amount, tuple) else quantities.parse(amount)
        total[name] = total.get(name, Fraction(0)) + value
