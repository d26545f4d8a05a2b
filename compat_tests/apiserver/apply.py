"""Server-side apply of a ResourceClaim's ``status`` (what a DRA driver sends for KEP-4817).

Only what a node-local driver relies on is emulated, from apiserver's structured-merge-diff
semantics for a list map (k8s.io/api ``resource/v1/types.go``: ``status.devices`` is
``+listType=map`` keyed by ``driver``, ``device``, ``pool`` and ``shareID``):

* the apply configuration is a partial object whose ``apiVersion`` and ``kind`` must be the
  resource's (400 otherwise), and the request must name a ``fieldManager`` (422);
* each manager owns the entries it applied: an entry in the configuration replaces the stored
  one with that key, an entry the manager applied before and leaves out now is removed, and
  every entry another manager owns stays as it is;
* an entry another manager owns, applied with different content, is a 409 conflict unless the
  request says ``force=true``, which moves the ownership;
* other ``status`` fields in the configuration are merged in as given (their ownership is not
  tracked).

Ownership lives in a table beside the store, by object UID (a claim made again under the same
name starts with no owners), not in ``metadata.managedFields``, which this emulator does not
model.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from compat_tests.apiserver import errors
from compat_tests.apiserver.patch import merge_patch
from compat_tests.apiserver.rules_common import as_dict, as_list

Obj = dict[str, Any]
Key = tuple[str, str, str, str]
APPLY = "application/apply-patch+yaml"


def device_key(entry: Any) -> Key:
    item = as_dict(entry)
    return (str(item.get("driver", "")), str(item.get("device", "")),
            str(item.get("pool", "")), str(item.get("shareID", "") or ""))


def key_text(key: Key) -> str:
    names = ("driver", "device", "pool", "shareID")
    return json.dumps({n: v for n, v in zip(names, key, strict=True) if v},
                      separators=(",", ":"), sort_keys=True)


class Owners:
    """Which manager applied which ``status.devices`` entries of which claim (by UID)."""

    def __init__(self) -> None:
        self._table: dict[str, dict[str, set[Key]]] = {}

    def of(self, uid: str) -> dict[str, set[Key]]:
        return self._table.get(uid, {})

    def record(self, uid: str, manager: str, keys: set[Key]) -> None:
        managers = self._table.setdefault(uid, {})
        for other, owned in managers.items():
            if other != manager:
                owned -= keys
        managers[manager] = set(keys)


def apply_status(current: Obj, body: Any, *, resource_api_version: str, kind: str,
                 name: str, manager: str, force: bool, owners: Owners) -> tuple[Obj, set[Key]]:
    """``current`` with the apply configuration ``body`` applied to its status; the keys
    ``manager`` owns afterwards. Raises the server's errors."""
    if not manager:
        raise errors.ApiError(errors.status(
            422, "Invalid", 'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required '
            "value: is required for apply patch"))
    if not isinstance(body, dict):
        raise errors.bad_request("error decoding YAML: the apply configuration is not an object")
    if body.get("apiVersion") != resource_api_version or body.get("kind") != kind:
        raise errors.bad_request(
            f"the API version in the data ({body.get('apiVersion')}) does not match the "
            f"expected API version ({resource_api_version})" if body.get("apiVersion") !=
            resource_api_version else f"the kind in the data ({body.get('kind')}) does not "
            f"match the expected kind ({kind})")
    meta = as_dict(body.get("metadata"))
    if meta.get("name") not in (None, name):
        raise errors.bad_request(f"the name of the object ({meta.get('name')}) does not match "
                                 f"the name on the URL ({name})")
    uid = str(as_dict(current.get("metadata")).get("uid", ""))
    mine_before = owners.of(uid).get(manager, set())
    others = {key: other for other, owned in owners.of(uid).items() if other != manager
              for key in owned}
    status = as_dict(body.get("status"))
    applied = [copy.deepcopy(e) for e in as_list(status.get("devices"))]
    applied_keys = [device_key(e) for e in applied]
    if len(set(applied_keys)) != len(applied_keys):
        raise errors.ApiError(errors.status(
            422, "Invalid", ".status.devices: duplicate entries for key "
            f"{key_text(next(k for k in applied_keys if applied_keys.count(k) > 1))}"))
    stored = {device_key(e): e for e in as_list(as_dict(current.get("status")).get("devices"))}
    conflicts = [key for key, entry in zip(applied_keys, applied, strict=True)
                 if key in others and stored.get(key) != entry]
    if conflicts and not force:
        listed = "\n".join(f'- conflict with "{others[k]}" using {resource_api_version}: '
                           f".status.devices[{key_text(k)}]" for k in conflicts)
        raise errors.ApiError(errors.status(
            409, "Conflict", f"Apply failed with {len(conflicts)} conflict"
            f"{'s' if len(conflicts) > 1 else ''}: {listed}",
            {"causes": [{"reason": "FieldManagerConflict", "field":
                         f".status.devices[{key_text(k)}]"} for k in conflicts]}))
    devices: list[Obj] = []
    by_key = dict(zip(applied_keys, applied, strict=True))
    for key, entry in stored.items():
        if key in by_key:
            devices.append(by_key.pop(key))
        elif key in mine_before and key not in others:
            continue  # this manager's, and it no longer applies it
        else:
            devices.append(entry)
    devices += list(by_key.values())
    out = copy.deepcopy(current)
    rest = {k: v for k, v in status.items() if k != "devices"}
    new_status = merge_patch(as_dict(out.get("status")), rest) if rest else \
        as_dict(out.get("status"))
    if devices:
        new_status["devices"] = devices
    else:
        new_status.pop("devices", None)
    out["status"] = new_status
    if meta.get("uid"):
        out.setdefault("metadata", {})["uid"] = meta["uid"]  # a precondition, as in an update
    return out, set(applied_keys)
