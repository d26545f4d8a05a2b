"""The server's rules for a shared device's ``capacity.requestPolicy`` (KEP-5075).

Read from k/k ``pkg/apis/resource/validation/validation.go`` (validateRequestPolicy,
validateValidRequestValues, validateRequestPolicyValidValues, validateRequestPolicyRange,
validateRequestPolicyRangeStep; the integer arithmetic a 1.36 server has, before the
DRAFractionalCapacityRange gate of later releases), called only for a device with
``allowMultipleAllocations: true`` whose capacity is new or changed:

- ``validValues`` and ``validRange`` are exclusive (Forbidden on the policy);
- ``validValues``: ``default`` required; sorted ascending, at most 10, unique, none above the
  capacity's ``value``, and ``default`` among them;
- ``validRange``: ``default`` and ``min`` required; ``min`` and ``max`` at most ``value``,
  ``min`` at most ``max``, ``default`` between them; ``step`` above zero, ``min + step`` at
  most ``value``, and ``default`` and ``max`` on the step grid from ``min`` (``Value()``, the
  integer rounded up, as the server reads them).

A driver publishing a shared device with a policy the server refuses gets its whole slice
refused, so these are what the publisher's slices must pass.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

from compat_tests.apiserver import fielderrors as fe
from compat_tests.apiserver import quantity as quantities
from compat_tests.apiserver.fielderrors import FieldError
from compat_tests.apiserver.rules_common import as_dict, as_list

MAX_VALID_VALUES = 10


def _q(raw: Any) -> Fraction | None:
    try:
        return quantities.parse(raw)
    except ValueError:
        return None  # the schema's quantity check reports it


def _s(raw: Any) -> str:
    return quantities.canonical(raw)


def validate_request_policy(capacity: dict[str, Any], path: str) -> list[FieldError]:
    """``path`` is the capacity's (``spec.devices[0].capacity[contexts]``)."""
    policy, value = capacity.get("requestPolicy"), _q(capacity.get("value"))
    if not isinstance(policy, dict) or value is None:
        return []
    here = f"{path}.requestPolicy"
    values, valid_range = as_list(policy.get("validValues")), policy.get("validRange")
    if values and valid_range is not None:
        return [fe.forbidden(here, 'exactly one policy can be specified, cannot specify '
                             '"validValues" and "validRange" at the same time')]
    if not values and valid_range is None:
        return []
    if policy.get("default") is None:
        which = "validValues" if values else "validRange"
        return [fe.required(f"{here}.default", f"required when {which} is defined")]
    default = _q(policy["default"])
    if default is None:
        return []
    if values:
        return _valid_values(policy["default"], default, value, capacity["value"], values,
                             f"{here}.validValues")
    return _valid_range(policy["default"], default, value, capacity["value"],
                        as_dict(valid_range), f"{here}.validRange")


def _valid_values(default_raw: Any, default: Fraction, value: Fraction, value_raw: Any,
                  values: list[Any], path: str) -> list[FieldError]:
    errs: list[FieldError] = []
    parsed = [_q(v) for v in values]
    if any(p is None for p in parsed):
        return []
    for index in range(len(parsed) - 1):
        if parsed[index] > parsed[index + 1]:  # type: ignore[operator]
            errs.append(fe.invalid(f"{path}[{index + 1}]", _s(values[index + 1]),
                                   "values must be sorted in ascending order"))
    if len(values) > MAX_VALID_VALUES:
        return [*errs, fe.too_many(path, len(values), MAX_VALID_VALUES)]
    seen: set[int] = set()
    for index, (raw, option) in enumerate(zip(values, parsed, strict=True)):
        assert option is not None
        if option > value:
            errs.append(fe.invalid(f"{path}[{index}]", _s(raw), "option is larger than "
                                   f"capacity value: {_s(value_raw)}"))
        key = math.ceil(option)  # quantityKeyInt: the integer value is the set key
        if key in seen:
            errs.append(fe.duplicate(f"{path}[{index}]", _s(raw)))
        seen.add(key)
    if default not in parsed:
        errs.append(fe.invalid(path, _s(default_raw),
                               "default value is not valid according to the requestPolicy"))
    return errs


def _valid_range(default_raw: Any, default: Fraction, value: Fraction, value_raw: Any,
                 valid_range: dict[str, Any], path: str) -> list[FieldError]:
    if valid_range.get("min") is None:
        return [fe.required(f"{path}.min", "required when validRange is defined")]
    low, high, step = (_q(valid_range.get(k)) if valid_range.get(k) is not None else None
                       for k in ("min", "max", "step"))
    if low is None:
        return []
    low_s, cap_s = _s(valid_range["min"]), _s(value_raw)
    errs: list[FieldError] = []
    if low > value:
        errs.append(fe.invalid(f"{path}.min", low_s, f"min is larger than capacity value: {cap_s}"))
    if default < low:
        errs.append(fe.invalid(f"{path}.default", _s(default_raw), f"default is less than min: "
                               f"{low_s}"))
    if high is not None:
        high_s = _s(valid_range["max"])
        if low > high:
            errs.append(fe.invalid(f"{path}.max", low_s, f"min is larger than max: {high_s}"))
        if high > value:
            errs.append(fe.invalid(f"{path}.max", high_s,
                                   f"max is larger than capacity value: {cap_s}"))
        if default > high:
            errs.append(fe.invalid(f"{path}.default", _s(default_raw),
                                   f"default is more than max: {high_s}"))
    if step is None:
        return errs
    step_s = _s(valid_range["step"])
    if step <= 0:
        return [*errs, fe.invalid(f"{path}.step", step_s, "must be greater than zero")]
    if low + step > value:
        errs.append(fe.invalid(f"{path}.step", step_s, f"one step {_s(_text(low + step))} is "
                               f"larger than capacity value: {cap_s}"))
    for raw, amount in ((default_raw, default), (valid_range.get("max"), high)):
        if amount is not None and (math.ceil(amount) - math.ceil(low)) % math.ceil(step):
            errs.append(fe.invalid(f"{path}.step", _s(raw), "value is not a multiple of a "
                                   f"given step ({step_s}) from ({low_s})"))
    return errs


def _text(amount: Fraction) -> str:
    return str(amount.numerator) if amount.denominator == 1 else \
        f"{math.ceil(amount * 10**9)}n"
