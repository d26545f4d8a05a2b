"""Create, update, patch and delete of stored objects, with the generic registry's semantics.

Follows apiserver ``pkg/registry/generic/registry/store.go`` and the create/update/delete handlers:
system fields are wiped on create and kept on update; ``generateName`` appends 5 characters from
``bcdfghjklmnpqrstvwxz2456789`` to at most 58 of the prefix; a ``resourceVersion`` sent on create is
an error; an update without one is unconditional (every DRA kind allows it), with a stale one a
409 Conflict; an update that changes nothing keeps the revision and sends no watch event; a
delete of an object with finalizers only sets ``deletionTimestamp``; an update that empties the
finalizers of such an object deletes it; deletes return the deleted object (ReturnDeletedObject).
"""

from __future__ import annotations

import copy
import random
import uuid
from collections.abc import Callable
from typing import Any

from compat_tests.apiserver import apply as server_side_apply
from compat_tests.apiserver import errors, pipeline, strategy
from compat_tests.apiserver import patch as patching
from compat_tests.apiserver.models import ServerModel
from compat_tests.apiserver.resources import RESOURCES, ResourceInfo
from compat_tests.apiserver.store import Store

Obj = dict[str, Any]
Authorize = Callable[[Obj, Obj], None]
"""Called with (stored, new) before a status write is validated; raises to refuse it."""
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"
_SYSTEM_FIELDS = ("creationTimestamp", "uid", "deletionTimestamp", "deletionGracePeriodSeconds",
                  "selfLink")


class Registry:
    """The REST storage of the resource.k8s.io kinds on top of one Store."""

    def __init__(self, store: Store, model: Callable[[], ServerModel],
                 namespaces: set[str]) -> None:
        self.store = store
        self.model = model
        self.namespaces = namespaces
        self.conflicts_pending = 0
        self.owners = server_side_apply.Owners()
        """Who applied which ``status.devices`` entries (server-side apply)."""

    # --- helpers -------------------------------------------------------------------------

    def _info(self, resource: str) -> ResourceInfo:
        return RESOURCES[resource]

    def _check_namespace(self, info: ResourceInfo, meta: Obj, namespace: str | None) -> None:
        if not info.namespaced:
            meta.pop("namespace", None)
            return
        sent = meta.get("namespace")
        if sent and namespace and sent != namespace:
            raise errors.bad_request("the namespace of the provided object does not match the "
                                     "namespace sent on the request")
        meta["namespace"] = sent or namespace
        if meta["namespace"] not in self.namespaces:
            raise errors.not_found("namespaces", "", str(meta["namespace"]))

    def _invalid(self, info: ResourceInfo, name: str, errs: list[Any]) -> errors.ApiError:
        return errors.invalid(info.kind, info.group, name, errs)

    def read(self, resource: str, version: str, obj: Obj) -> Obj:
        return pipeline.encode_read(resource, version, obj, self.model())

    # --- create --------------------------------------------------------------------------

    def create(self, resource: str, version: str, body: Any, namespace: str | None = None,
               field_validation: str = "Strict", dry_run: bool = False) -> tuple[Obj, list[str]]:
        info, model = self._info(resource), self.model()
        obj, warnings = pipeline.decode_write(resource, version, body, model, field_validation)
        meta = obj.setdefault("metadata", {})
        for key in _SYSTEM_FIELDS:
            meta.pop(key, None)
        self._check_namespace(info, meta, namespace)
        if not meta.get("name") and meta.get("generateName"):
            taken = self.store.names(resource)
            while True:
                name = meta["generateName"][:58] + "".join(random.choices(_NAME_CHARS, k=5))
                if name not in taken:
                    break
            meta["name"] = name
        strategy.prepare_create(resource, obj, model)
        errs = pipeline.rule_errors(resource, obj, None, model)
        if errs:
            raise self._invalid(info, meta.get("name", ""), errs)
        if meta.get("resourceVersion"):
            raise errors.not_a_status("resourceVersion should not be set on objects to be created")
        if self.store.get(resource, meta.get("namespace"), meta["name"]) is not None:
            raise errors.already_exists(resource, info.group, meta["name"])
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = strategy.now()
        if resource == "resourceslices" and obj["spec"].get("driver", "").lower() != \
                obj["spec"].get("driver", ""):
            warnings.append(f"spec.driver: driver names should be lowercase; "
                            f'"{obj["spec"]["driver"]}" contains uppercase characters')
        obj = strategy.prune_empty(obj)
        stored = obj if dry_run else self.store.commit(resource, "ADDED", obj)
        return self.read(resource, version, stored), warnings

    # --- update --------------------------------------------------------------------------

    def _preconditions(self, info: ResourceInfo, old: Obj, uid: Any, rv: Any) -> None:
        old_meta = old["metadata"]
        if uid and uid != old_meta.get("uid"):
            raise errors.conflict(info.name, info.group, old_meta["name"],
                                  f"Precondition failed: UID in precondition: {uid}, UID in "
                                  f"object meta: {old_meta.get('uid')}")
        if rv and rv != old_meta.get("resourceVersion"):
            raise errors.conflict(info.name, info.group, old_meta["name"])

    def update(self, resource: str, version: str, name: str, body: Any,
               namespace: str | None = None, field_validation: str = "Strict",
               dry_run: bool = False, status: bool = False,
               authorize: Authorize | None = None) -> tuple[Obj, list[str]]:
        info, model = self._info(resource), self.model()
        obj, warnings = pipeline.decode_write(resource, version, body, model, field_validation)
        meta = obj.setdefault("metadata", {})
        if meta.get("name") != name:
            raise errors.bad_request(f"the name of the object ({meta.get('name', '')}) does not "
                                     f"match the name on the URL ({name})")
        self._check_namespace(info, meta, namespace)
        old = self.store.get(resource, meta.get("namespace"), name)
        if old is None:
            raise errors.not_found(resource, info.group, name)
        if self.conflicts_pending > 0:
            self.conflicts_pending -= 1
            raise errors.conflict(resource, info.group, name)
        self._preconditions(info, old, meta.get("uid"), meta.get("resourceVersion"))
        old_meta = old["metadata"]
        for key in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds"):
            if key in old_meta:
                meta[key] = old_meta[key]
            else:
                meta.pop(key, None)
        meta.pop("selfLink", None)
        meta["resourceVersion"] = old_meta["resourceVersion"]
        if status:
            strategy.prepare_status_update(obj, old, model)
            if authorize is not None:
                authorize(old, obj)
        else:
            strategy.prepare_update(resource, obj, old, model)
        errs = pipeline.rule_errors(resource, obj, old, model, status=status)
        if errs:
            raise self._invalid(info, name, errs)
        obj = strategy.prune_empty(obj)
        if obj == old or dry_run:
            return self.read(resource, version, obj), warnings
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self.store.commit(resource, "DELETED", obj, old)
            return self.read(resource, version, obj), warnings
        stored = self.store.commit(resource, "MODIFIED", obj, old)
        return self.read(resource, version, stored), warnings

    def patch(self, resource: str, version: str, name: str, content_type: str, body: Any,
              namespace: str | None = None, field_validation: str = "Strict",
              dry_run: bool = False, status: bool = False, *, field_manager: str = "",
              force: bool = False,
              authorize: Authorize | None = None) -> tuple[Obj, list[str]]:
        info = self._info(resource)
        old = self.store.get(resource, namespace if info.namespaced else None, name)
        if old is None:
            raise errors.not_found(resource, info.group, name)
        current = self.read(resource, version, old)
        if content_type.split(";")[0].strip() == server_side_apply.APPLY and status and \
                resource == "resourceclaims":
            return self._apply_status(resource, version, name, body, current, namespace,
                                      field_validation, dry_run, field_manager, force, authorize)
        patched = patching.apply(content_type, current, body, resource, version,
                                 self.model().schema_release)
        if not isinstance(patched, dict):
            raise errors.bad_request("the patch produced something that is not an object")
        meta = patched.setdefault("metadata", {})
        if meta.get("resourceVersion") == old["metadata"]["resourceVersion"]:
            meta.pop("resourceVersion")  # not sent by the client: unconditional
        return self.update(resource, version, name, patched, namespace, field_validation,
                           dry_run, status, authorize)

    def _apply_status(self, resource: str, version: str, name: str, body: Any, current: Obj,
                      namespace: str | None, field_validation: str, dry_run: bool,
                      manager: str, force: bool,
                      authorize: Authorize | None) -> tuple[Obj, list[str]]:
        info = self._info(resource)
        applied, keys = server_side_apply.apply_status(
            current, body, resource_api_version=f"{info.group}/{version}", kind=info.kind,
            name=name, manager=manager, force=force, owners=self.owners)
        applied["metadata"].pop("resourceVersion", None)  # apply is unconditional
        obj, warnings = self.update(resource, version, name, applied, namespace,
                                    field_validation, dry_run, True, authorize)
        if not dry_run:
            self.owners.record(str(obj["metadata"].get("uid", "")), manager, keys)
        return obj, warnings

    # --- delete --------------------------------------------------------------------------

    def delete(self, resource: str, version: str, name: str, namespace: str | None = None,
               options: Obj | None = None, dry_run: bool = False) -> Obj:
        info = self._info(resource)
        old = self.store.get(resource, namespace if info.namespaced else None, name)
        if old is None:
            raise errors.not_found(resource, info.group, name)
        pre = (options or {}).get("preconditions") or {}
        uid, rv = pre.get("uid"), pre.get("resourceVersion")
        if rv and rv != old["metadata"]["resourceVersion"]:
            raise errors.conflict(resource, info.group, name,
                                  f"Precondition failed: ResourceVersion in precondition: {rv}, "
                                  f"ResourceVersion in object meta: "
                                  f"{old['metadata']['resourceVersion']}")
        self._preconditions(info, old, uid, None)
        if dry_run:
            return self.read(resource, version, old)
        if old["metadata"].get("finalizers"):
            if old["metadata"].get("deletionTimestamp"):
                return self.read(resource, version, old)
            terminating = copy.deepcopy(old)
            terminating["metadata"]["deletionTimestamp"] = strategy.now()
            terminating["metadata"]["deletionGracePeriodSeconds"] = 0
            stored = self.store.commit(resource, "MODIFIED", terminating, old)
            return self.read(resource, version, stored)
        self.store.commit(resource, "DELETED", old, old)
        return self.read(resource, version, old)

    def delete_collection(self, resource: str, version: str, namespace: str | None,
                          match: Callable[[Obj], bool], options: Obj | None = None,
                          dry_run: bool = False) -> list[Obj]:
        info = self._info(resource)
        deleted = []
        for obj in self.store.list(resource, namespace if info.namespaced else None, match):
            meta = obj["metadata"]
            try:
                deleted.append(self.delete(resource, version, meta["name"],
                                           meta.get("namespace"), options, dry_run))
            except errors.ApiError as err:
                if err.code != 404:
                    raise
        return deleted
