"""events.k8s.io/v1 Events: create, get, list, patch (the series updates recorders send), delete.

Every Event written is checked twice, as a 1.36 server checks it: against the strict JSON schema
of ``events.k8s.io/v1 Event`` that the ``kubernetes-validate`` test dependency ships for 1.36 (a
wrong type or an unknown field: 400 BadRequest, as strict decoding answers), then by the
validation rules of k/k ``pkg/apis/core/validation/events.go`` for events.k8s.io/v1
(``ValidateEventCreate``, ``ValidateEventUpdate``: 422 Invalid). Every Event refused as
malformed is also kept in ``refusals``, so a test can say none was. Not modelled: the events
TTL (an hour by default), field selectors beyond name and namespace, watch.
"""

from __future__ import annotations

import copy
import re
import uuid
from typing import Any

from compat_tests.apiserver import errors, fielderrors, strategy, strict_schemas
from compat_tests.apiserver import patch as patching
from compat_tests.apiserver.fielderrors import FieldError
from compat_tests.apiserver.resources import ResourceInfo

GROUP = "events.k8s.io"
VERSION = "v1"
EVENTS = ResourceInfo("events", "event", "Event", True, GROUP,
                      ("metadata.name", "metadata.namespace"), short_names=("ev",))
SCHEMA_RELEASE = "1.36"

REPORTING_INSTANCE_LIMIT = 128
ACTION_LIMIT = 128
REASON_LIMIT = 128
NOTE_LIMIT = 1024
_IMMUTABLE = ("regarding", "reason", "note", "deprecatedSource", "deprecatedFirstTimestamp",
              "deprecatedLastTimestamp", "deprecatedCount", "type", "eventTime", "action",
              "related", "reportingController", "reportingInstance")
Obj = dict[str, Any]


def schema_errors(obj: Obj) -> list[str]:
    """What the 1.36 strict schema of events.k8s.io/v1 Event says against ``obj``."""
    return strict_schemas.schema_errors("event-events-v1.json", obj, SCHEMA_RELEASE)


def _series_errors(event: Obj) -> list[FieldError]:
    series = event.get("series")
    if series is None:
        return []
    found = []
    if int(series.get("count") or 0) < 2:
        found.append(fielderrors.invalid("series.count", "", "should be at least 2"))
    if not series.get("lastObservedTime"):
        found.append(fielderrors.required("series.lastObservedTime"))
    return found


def _legacy_errors(event: Obj) -> list[FieldError]:
    """``legacyValidateEvent`` for an Event with an eventTime (events.k8s.io names)."""
    found = []
    namespace = event.get("metadata", {}).get("namespace", "")
    regarding = event.get("regarding") or {}
    if not regarding.get("namespace") and namespace not in ("default", "kube-system"):
        found.append(fielderrors.invalid("involvedObject.namespace", "",
                                         "does not match event.namespace"))
    controller = event.get("reportingController", "")
    if not controller:
        found.append(fielderrors.required("reportingController"))
    found += [fielderrors.invalid("reportingController", controller, msg)
              for msg in fielderrors.label_key(controller)]
    checks = (("reportingInstance", REPORTING_INSTANCE_LIMIT), ("action", ACTION_LIMIT),
              ("reason", REASON_LIMIT))
    for key, limit in checks:
        value = event.get(key, "")
        if not value:
            found.append(fielderrors.required(key))
        if len(value) > limit:
            found.append(fielderrors.invalid(key, "", f"can have at most {limit} characters"))
    if len(event.get("note", "")) > NOTE_LIMIT:
        found.append(fielderrors.invalid("message", "",
                                         f"can have at most {NOTE_LIMIT} characters"))
    found += [fielderrors.invalid("namespace", namespace, msg)
              for msg in fielderrors.dns1123_subdomain(namespace)]
    return found


def rule_errors(event: Obj, old: Obj | None = None) -> list[FieldError]:
    """``ValidateEventCreate`` (``old`` None) or ``ValidateEventUpdate`` for events.k8s.io/v1."""
    found = _legacy_errors(event)
    name = event.get("metadata", {}).get("name", "")
    if old is None:
        found += [fielderrors.invalid("metadata.name", name, msg)
                  for msg in fielderrors.dns1123_subdomain(name)]
        found += _series_errors(event)
        if not event.get("eventTime"):
            found.append(fielderrors.required("eventTime"))
        if event.get("type") not in ("Normal", "Warning"):
            found.append(fielderrors.invalid("type", "",
                                             f"has invalid value: {event.get('type', '')}"))
        for key, path in (("deprecatedFirstTimestamp", "firstTimestamp"),
                          ("deprecatedLastTimestamp", "lastTimestamp"),
                          ("deprecatedCount", "count"), ("deprecatedSource", "source")):
            if event.get(key):
                found.append(fielderrors.invalid(path, "", "needs to be unset"))
        return found
    if event.get("series") != old.get("series"):
        found += _series_errors(event)
    for key in _IMMUTABLE:
        if event.get(key) != old.get(key):
            found.append(fielderrors.invalid(key, event.get(key),
                                             "field is immutable"))
    return found


def validate(event: Obj, old: Obj | None = None) -> list[str]:
    """Every reason a 1.36 server would refuse ``event`` (an empty list when it accepts it)."""
    return schema_errors(event) or [str(e) for e in rule_errors(event, old)]


class EventStore:
    """The Events of one emulator, on its store (so revisions and the request log are shared)."""

    def __init__(self, store: Any, namespaces: set[str]) -> None:
        self.store = store
        self.namespaces = namespaces
        self.refusals: list[tuple[Obj, str]] = []

    def _refuse(self, body: Any, err: errors.ApiError) -> errors.ApiError:
        self.refusals.append((copy.deepcopy(body), str(err.status.get("message", ""))))
        return err

    def _decode(self, body: Any, name: str) -> Obj:
        if not isinstance(body, dict):
            raise self._refuse(body, errors.bad_request(
                "the object provided is unrecognized (must be of type Event)"))
        problems = schema_errors(body)
        if problems:
            raise self._refuse(body, errors.bad_request(
                f'Event in version "{VERSION}" cannot be handled as a Event: {problems[0]}'))
        return copy.deepcopy(body)

    def create(self, namespace: str, body: Any) -> Obj:
        obj = self._decode(body, "")
        meta = obj.setdefault("metadata", {})
        sent = meta.get("namespace")
        if sent and sent != namespace:
            raise self._refuse(body, errors.bad_request(
                "the namespace of the provided object does not match the namespace sent on "
                "the request"))
        meta["namespace"] = namespace
        if namespace not in self.namespaces:
            raise self._refuse(body, errors.not_found("namespaces", "", namespace))
        for key in ("uid", "creationTimestamp", "resourceVersion"):
            meta.pop(key, None)
        problems = rule_errors(obj)
        if problems:
            raise self._refuse(body, errors.invalid("Event", GROUP, meta.get("name", ""),
                                                    problems))
        if self.store.get("events", namespace, meta["name"]) is not None:
            raise errors.already_exists("events", GROUP, meta["name"])
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = strategy.now()
        obj["apiVersion"], obj["kind"] = f"{GROUP}/{VERSION}", "Event"
        return self.store.commit("events", "ADDED", obj)

    def patch(self, namespace: str, name: str, content_type: str, body: Any) -> Obj:
        old = self.store.get("events", namespace, name)
        if old is None:
            raise errors.not_found("events", GROUP, name)
        base = content_type.split(";")[0].strip()
        if base == patching.JSON_PATCH:
            patched = patching.json_patch(old, body)
        elif base in (patching.MERGE, patching.STRATEGIC):
            # No list in an Event has a patch strategy: a strategic merge is a merge here.
            patched = patching.merge_patch(old, body)
        else:
            raise errors.ApiError(errors.status(415, "UnsupportedMediaType",
                                                f"the body of the request was in an unknown "
                                                f"format - accepted media types include: "
                                                f"{', '.join(patching.ACCEPTED)}"))
        new = self._decode(patched, name)
        meta = new.setdefault("metadata", {})
        for key in ("uid", "creationTimestamp", "namespace", "name"):
            meta[key] = old["metadata"][key]
        sent_rv = meta.get("resourceVersion")
        if sent_rv and sent_rv != old["metadata"]["resourceVersion"]:
            raise errors.conflict("events", GROUP, name)
        problems = rule_errors(new, old)
        if problems:
            raise self._refuse(patched, errors.invalid("Event", GROUP, name, problems))
        if new == old:
            return old
        return self.store.commit("events", "MODIFIED", new, old)

    def delete(self, namespace: str, name: str) -> Obj:
        old = self.store.get("events", namespace, name)
        if old is None:
            raise errors.not_found("events", GROUP, name)
        self.store.commit("events", "DELETED", old, old)
        return old


PATH = re.compile(
    r"^/apis/events\.k8s\.io/(?P<version>[^/]+)/(?P<watch>watch/)?"
    r"(?:namespaces/(?P<namespace>[^/]+)/)?(?P<resource>[^/]+)(?:/(?P<name>[^/]+))?$")


def group() -> Obj:
    entry = {"groupVersion": f"{GROUP}/{VERSION}", "version": VERSION}
    return {"name": GROUP, "versions": [entry], "preferredVersion": entry}
