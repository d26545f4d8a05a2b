"""The 1.36 granular authorization of ResourceClaim status writes (KEP-4817, k/k PR 134947).

With the DRAResourceClaimGranularStatusAuthorization gate (beta, on by default from 1.36), a
write to ``resourceclaims/status`` that adds, changes or removes ``status.devices`` entries is
authorized again per driver whose entries it touches: a node-local driver needs the verb
``associated-node:<verb>`` (``update`` for PUT, ``patch`` for PATCH and apply) on the synthetic
subresource ``resourceclaims/driver`` with ``resourceNames`` the driver name, besides the
ordinary ``resourceclaims/status`` verb (the Kubernetes documentation's "DRA granular status
authorization" page; k/k ``pkg/registry/resource/resourceclaim/strategy.go``; the
dra-example-driver chart's ``templates/clusterrole.yaml`` carries exactly that rule). A missing
permission is a 403 for the whole write.

The emulator has no RBAC: the identity holds every permission but those a test denies, here
``faults.deny("associated-node:patch", "resourceclaims/driver")`` (every driver) or
``"resourceclaims/driver/<driver>"`` (one driver). Node association (the service account's
bound-token node name against the claim's allocation) is not modelled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from compat_tests.apiserver import errors
from compat_tests.apiserver.apply import device_key
from compat_tests.apiserver.faults import Faults, forbidden_message
from compat_tests.apiserver.rules_common import as_dict, as_list

GATE = "DRAResourceClaimGranularStatusAuthorization"
SUBRESOURCE = "resourceclaims/driver"


def touched_drivers(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Drivers whose ``status.devices`` entries differ between ``old`` and ``new``."""
    def entries(obj: dict[str, Any]) -> dict[Any, Any]:
        return {device_key(e): e for e in as_list(as_dict(obj.get("status")).get("devices"))}

    before, after = entries(old), entries(new)
    return sorted({key[0] for key in before.keys() | after.keys()
                   if before.get(key) != after.get(key)})


def authorizer(faults: Faults, user: str, verb: str, namespace: str,
               name: str) -> Callable[[dict[str, Any], dict[str, Any]], None]:
    """The check a status write of claim ``namespace/name`` by ``user`` goes through."""
    def authorize(old: dict[str, Any], new: dict[str, Any]) -> None:
        wanted = f"associated-node:{verb}"
        for driver in touched_drivers(old, new):
            if faults.is_denied(wanted, SUBRESOURCE) or \
                    faults.is_denied(wanted, f"{SUBRESOURCE}/{driver}"):
                message = forbidden_message(user, wanted, "resourceclaims", "driver",
                                            "resource.k8s.io", namespace)
                raise errors.forbidden("resourceclaims", "resource.k8s.io", name,
                                       f"{message}: not allowed to update status.devices "
                                       f"of driver {driver!r}")

    return authorize
