"""Writes to core/v1 Nodes: update (PUT) and patch, as ``kubectl label node`` sends them.

Follows k/k ``pkg/registry/core/node/strategy.go``: an update keeps the stored status
(``PrepareForUpdate``: ``newNode.Status = oldNode.Status``; status is written through
``nodes/status``, not emulated here) and is allowed without a resourceVersion
(``AllowUnconditionalUpdate``); a stale one is a 409 Conflict. ``kubectl label`` reads the Node,
computes a JSON merge patch (``jsonpatch.CreateMergePatch``, kubectl ``pkg/cmd/label/label.go``)
and sends it as ``application/merge-patch+json``: ``{"metadata":{"labels":{"k":"v"}}}`` to set,
``{"k": null}`` to remove. An update that changes nothing keeps the revision and sends no watch
event. What is written is checked as a 1.36 server checks it: against the strict JSON schema of
core/v1 Node that the ``kubernetes-validate`` test dependency ships for 1.36 (400 BadRequest),
then the metadata rules of apimachinery ``pkg/api/validation/objectmeta.go``
(``ValidateObjectMetaUpdate``: name and uid immutable) and ``pkg/apis/meta/v1/validation``
(``ValidateLabels``: qualified keys, values of at most 63 characters) as 422 Invalid.

Not modelled: ``ValidateNodeUpdate``'s spec rules (podCIDR, providerID, taints), the
``nodes/status`` writes, and the strategic merge of Node lists that have a patch strategy
(``spec.podCIDRs``, ``status.addresses``...): a strategic merge patch is applied as a merge
patch, which is exact for what ``kubectl label`` and ``annotate`` change (maps).
"""

from __future__ import annotations

import copy
from typing import Any

from compat_tests.apiserver import errors, fielderrors, strict_schemas
from compat_tests.apiserver import patch as patching
from compat_tests.apiserver.fielderrors import FieldError
from compat_tests.apiserver.store import Store

SCHEMA_RELEASE = "1.36"
Obj = dict[str, Any]


def schema_errors(obj: Obj) -> list[str]:
    """What the 1.36 strict schema of core/v1 Node says against ``obj``."""
    return strict_schemas.schema_errors("node-v1.json", obj, SCHEMA_RELEASE)


def metadata_errors(new: Obj, old: Obj) -> list[FieldError]:
    """``ValidateObjectMetaUpdate`` and ``ValidateLabels``/annotation keys, as far as a label
    or annotation change can break them."""
    found: list[FieldError] = []
    meta, old_meta = new.get("metadata", {}), old.get("metadata", {})
    for key in ("name", "uid"):
        if meta.get(key) != old_meta.get(key):
            found.append(fielderrors.invalid(f"metadata.{key}", meta.get(key, ""),
                                             "field is immutable"))
    for key, value in sorted((meta.get("labels") or {}).items()):
        found += [fielderrors.invalid("metadata.labels", key, msg)
                  for msg in fielderrors.label_key(key)]
        found += [fielderrors.invalid("metadata.labels", value, msg)
                  for msg in fielderrors.label_value(str(value))]
    for key in sorted(meta.get("annotations") or {}):
        found += [fielderrors.invalid("metadata.annotations", key, msg)
                  for msg in fielderrors.label_key(key.lower())]
    return found


class NodeWrites:
    """Update and patch of the Nodes of one emulator's store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def update(self, name: str, body: Any) -> Obj:
        old = self.store.get("nodes", None, name)
        if old is None:
            raise errors.not_found("nodes", "", name)
        if not isinstance(body, dict):
            raise errors.bad_request("the object provided is unrecognized (must be of type Node)")
        problems = schema_errors(body)
        if problems:
            raise errors.bad_request(f'Node in version "v1" cannot be handled as a Node: '
                                     f"{problems[0]}")
        new = copy.deepcopy(body)
        meta = new.setdefault("metadata", {})
        if meta.get("name", name) != name:
            raise errors.bad_request(f"the name of the object ({meta.get('name')}) does not "
                                     f"match the name on the URL ({name})")
        meta["name"] = name
        sent_rv = meta.get("resourceVersion")
        if sent_rv and sent_rv != old["metadata"]["resourceVersion"]:
            raise errors.conflict("nodes", "", name)
        meta.setdefault("uid", old["metadata"].get("uid"))
        meta["creationTimestamp"] = old["metadata"].get("creationTimestamp")
        meta["resourceVersion"] = old["metadata"]["resourceVersion"]
        new["status"] = copy.deepcopy(old.get("status", {}))  # PrepareForUpdate
        new["apiVersion"], new["kind"] = "v1", "Node"
        problems_422 = metadata_errors(new, old)
        if problems_422:
            raise errors.invalid("Node", "", name, problems_422)
        if new == old:
            return old
        return self.store.commit("nodes", "MODIFIED", new, old)

    def patch(self, name: str, content_type: str, body: Any) -> Obj:
        old = self.store.get("nodes", None, name)
        if old is None:
            raise errors.not_found("nodes", "", name)
        kind = content_type.split(";")[0].strip()
        if kind == patching.JSON_PATCH:
            patched = patching.json_patch(old, body)
        elif kind in (patching.MERGE, patching.STRATEGIC):
            patched = patching.merge_patch(old, body)
        else:
            raise errors.ApiError(errors.status(
                415, "UnsupportedMediaType", f"the body of the request was in an unknown "
                f"format - accepted media types include: {', '.join(patching.ACCEPTED)}"))
        if not isinstance(patched, dict):
            raise errors.bad_request("the patch produced something that is not an object")
        meta = patched.setdefault("metadata", {})
        if meta.get("resourceVersion") == old["metadata"]["resourceVersion"]:
            meta.pop("resourceVersion")  # not sent by the client: unconditional
        return self.update(name, patched)
