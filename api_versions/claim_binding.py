"""A claim's binding conditions (KEP-5007) as resource.k8s.io v1, v1beta2 and v1beta1 spell them.

``status.allocation.devices.results[].bindingConditions`` and ``bindingFailureConditions``
(lists of condition types, copied by the scheduler from the device when it allocated) and
``status.devices[].conditions[]`` (``metav1.Condition``) are spelt alike in the three versions
(k8s.io/api ``resource/{v1,v1beta2,v1beta1}/types.go`` v0.36.2). A status entry answers a
result when driver, pool and device match, as the 1.36 scheduler's
``getAllocatedDeviceStatus`` matches them (k/k ``pkg/scheduler/framework/plugins/
dynamicresources/dynamicresources.go``); with a ``shareID`` on both, it must match too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from api_versions.resource_claims import parse_claim
from value_types.binding import BindingState


def _texts(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def binding_states(version: str, obj: Mapping[str, Any], driver: str
                   ) -> tuple[BindingState, ...]:
    """Each of ``driver``'s allocation results of claim ``obj``, in the server's order, with
    its binding conditions and those its status entry has True; empty when the claim is not
    allocated. Raises ValueError as :func:`~api_versions.resource_claims.parse_claim` does."""
    claim = parse_claim(version, obj, driver)
    status = _dict(obj.get("status"))
    raw = _dict(_dict(status.get("allocation")).get("devices")).get("results")
    entries = [_dict(e) for e in status.get("devices") or [] if isinstance(e, Mapping)]
    states = []
    for result, shape in zip(claim.results, raw if isinstance(raw, list) else [],
                             strict=False):
        if result.driver != driver:
            continue
        shape = _dict(shape)
        true: set[str] = set()
        for entry in entries:
            if (entry.get("driver"), entry.get("pool"), entry.get("device")) != \
                    (result.driver, result.pool, result.device):
                continue
            if result.share_id and entry.get("shareID") not in (None, result.share_id):
                continue
            true |= {str(c.get("type")) for c in map(_dict, entry.get("conditions") or [])
                     if c.get("status") == "True"}
            break
        states.append(BindingState(result, _texts(shape.get("bindingConditions")),
                                   _texts(shape.get("bindingFailureConditions")),
                                   frozenset(true)))
    return tuple(states)
