"""The HTTP face of the emulator: request routing, the gates every request passes, REST verbs.

Paths and verbs follow the apiserver's RequestInfo rules (``/apis/<group>/<version>/[watch/]
[namespaces/<ns>/]<resource>[/<name>[/<subresource>]]``; GET on a collection is ``list``, or
``watch`` with ``watch=true``; DELETE on a collection is ``deletecollection``). A group version
the model does not serve answers with the server mux's plain ``404 page not found``.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web
from multidict import CIMultiDict

from compat_tests.apiserver import claim_authz, discovery, errors, selectors
from compat_tests.apiserver import events as events_api
from compat_tests.apiserver.core_objects import CONFIGMAPS, NAMESPACES, CoreObjects
from compat_tests.apiserver.faults import Faults, LoggedRequest, Tokens, forbidden_message
from compat_tests.apiserver.models import GROUP, ServerModel
from compat_tests.apiserver.nodes import NodeWrites
from compat_tests.apiserver.pipeline import FIELD_VALIDATIONS
from compat_tests.apiserver.registry import Registry
from compat_tests.apiserver.resources import NODES, RESOURCES, ResourceInfo
from compat_tests.apiserver.store import Store

_RESOURCE_PATH = re.compile(
    r"^/apis/(?P<group>[^/]+)/(?P<version>[^/]+)/(?P<watch>watch/)?"
    r"(?:namespaces/(?P<namespace>[^/]+)/)?(?P<resource>[^/]+)(?:/(?P<name>[^/]+))?"
    r"(?:/(?P<sub>[^/]+))?$")
_NODE_PATH = re.compile(
    r"^/api/v1/(?P<watch>watch/)?nodes(?:/(?P<name>[^/]+))?(?:/(?P<sub>status))?$")
_CORE_PATH = re.compile(
    r"^/api/v1/namespaces/(?P<namespace>[^/]+)(?:/(?P<resource>configmaps)(?:/(?P<name>[^/]+))?)?$")
_EXPIRED_CONTINUE = (
    "The provided continue parameter is too old to display a consistent list result. You can "
    "start a new list without the continue parameter, or use the continue token in this response "
    "to retrieve the remainder of the results. Continuing with the provided token results in an "
    "inconsistent list - objects that were created, modified, or deleted between the time the "
    "first chunk was returned and now may show up in the list.")


class Backend(Protocol):
    """What the handlers need from the emulator."""

    model: ServerModel
    store: Store
    registry: Registry
    faults: Faults
    tokens: Tokens
    requests: list[LoggedRequest]
    default_field_validation: str
    bookmark_interval: float
    events: events_api.EventStore
    nodes: NodeWrites
    core: CoreObjects

    @property
    def address(self) -> str: ...


@dataclass
class Target:
    verb: str
    info: ResourceInfo
    version: str
    namespace: str | None
    name: str
    subresource: str


def json_response(obj: Any, status: int = 200, warnings: list[str] | None = None,
                  headers: dict[str, str] | None = None) -> web.Response:
    all_headers: CIMultiDict[str] = CIMultiDict(headers or {})
    for warning in warnings or []:
        all_headers.add("Warning", "299 - " + json.dumps(warning))
    return web.json_response(obj, status=status, headers=all_headers)


def error_response(err: errors.ApiError) -> web.Response:
    if err.text is not None:
        return web.Response(status=err.code, text=err.text, headers=err.headers,
                            content_type="text/plain")
    return json_response(err.status, err.code, headers=err.headers)


def page_not_found() -> web.Response:
    return web.Response(status=404, text="404 page not found\n",
                        content_type="text/plain")


def _verb(method: str, name: str, watch: bool, query: Any) -> str:
    if method == "GET":
        if watch or query.get("watch") in ("true", "1"):
            return "watch"
        return "get" if name else "list"
    return {"POST": "create", "PUT": "update", "PATCH": "patch",
            "DELETE": "delete" if name else "deletecollection"}.get(method, method.lower())


def parse_target(request: web.Request, model: ServerModel) -> Target | web.Response | None:
    """The resource a request is for; a Response for unserved paths; None for non-resources."""
    path, query = request.path, request.query
    match = _NODE_PATH.match(path)
    if match:
        name = match["name"] or ""
        return Target(_verb(request.method, name, bool(match["watch"]), query), NODES, "v1",
                      None, name, match["sub"] or "")
    match = _CORE_PATH.match(path)
    if match:
        if match["resource"]:
            name = match["name"] or ""
            return Target(_verb(request.method, name, False, query), CONFIGMAPS, "v1",
                          match["namespace"], name, "")
        return Target(_verb(request.method, "x", False, query), NAMESPACES, "v1", None,
                      match["namespace"], "")
    match = events_api.PATH.match(path)
    if match:
        if match["version"] != events_api.VERSION:
            return page_not_found()
        if match["resource"] != "events":
            raise errors.path_not_found()
        name = match["name"] or ""
        return Target(_verb(request.method, name, bool(match["watch"]), query),
                      events_api.EVENTS, events_api.VERSION, match["namespace"], name, "")
    match = _RESOURCE_PATH.match(path)
    if match is None or match["group"] != GROUP:
        return None
    if not model.serves(match["version"]):
        return page_not_found()
    info = RESOURCES.get(match["resource"])
    sub = match["sub"] or ""
    if info is None or (match["namespace"] and not info.namespaced) or (
            sub and (sub != "status" or not info.status)):
        raise errors.path_not_found()
    name = match["name"] or ""
    return Target(_verb(request.method, name, bool(match["watch"]), query), info,
                  match["version"], match["namespace"], name, sub)


def discovery_response(backend: Backend, path: str) -> web.Response | None:
    model = backend.model
    doc: dict[str, Any] | None
    if path == "/version":
        return json_response(discovery.version_info(model))
    if path == "/api":
        return json_response(discovery.api_versions(backend.address))
    if path == "/api/v1":
        return json_response(discovery.core_resource_list())
    if path == "/apis":
        return json_response(discovery.group_list(model))
    if path == f"/apis/{events_api.GROUP}":
        return json_response(discovery.events_group())
    if path == f"/apis/{events_api.GROUP}/{events_api.VERSION}":
        return json_response(discovery.events_resource_list())
    if path in ("/healthz", "/livez", "/readyz"):
        return web.Response(text="ok", content_type="text/plain")
    if path == f"/apis/{GROUP}":
        doc = discovery.group(model)
        return json_response(doc) if doc else page_not_found()
    if path.startswith(f"/apis/{GROUP}/") and path.count("/") == 3:
        doc = discovery.resource_list(model, path.rsplit("/", 1)[1])
        return json_response(doc) if doc else page_not_found()
    return None


async def read_body(request: web.Request, entry: LoggedRequest) -> Any:
    raw = await request.read()
    if not raw:
        return None
    try:
        entry.body = json.loads(raw)
    except ValueError as err:
        entry.body = raw.decode(errors="replace")
        raise errors.bad_request(f"couldn't get version/kind; json parse error: {err}") from err
    return entry.body


def gate(backend: Backend, request: web.Request, target: Target, entry: LoggedRequest) -> None:
    """Injected failures and authorization (after authentication), in the server's order."""
    resource = f"{target.info.name}/{target.subresource}" if target.subresource else \
        target.info.name
    injected = backend.faults.take(target.verb, resource)
    if injected is not None:
        raise injected
    if backend.faults.is_denied(target.verb, resource):
        message = forbidden_message(entry.user, target.verb, target.info.name, target.subresource,
                                    target.info.group, target.namespace or "")
        raise errors.forbidden(target.info.name, target.info.group, target.name, message)


def _options(query: Any, backend: Backend) -> tuple[str, bool]:
    validation = query.get("fieldValidation") or backend.default_field_validation
    if validation not in FIELD_VALIDATIONS:
        raise errors.bad_request(f'invalid fieldValidation "{validation}": must be one of '
                                 '"Ignore", "Warn", or "Strict"')
    return validation, query.get("dryRun") == "All"


def _continue_start(backend: Backend, token: str) -> str:
    try:
        decoded = json.loads(base64.urlsafe_b64decode(token.encode()))
        revision, start = int(decoded["rv"]), str(decoded["start"])
    except (ValueError, KeyError, TypeError) as err:
        raise errors.bad_request(f"continue key is not valid: {err}") from err
    if revision < backend.store.compacted:
        raise errors.expired(_EXPIRED_CONTINUE)
    return start


def list_response(backend: Backend, target: Target, query: Any) -> web.Response:
    info, store = target.info, backend.store
    match = selectors.predicate(info, target.version, query)
    requested = query.get("resourceVersion", "")
    if requested not in ("", "0") and requested.isdigit() and int(requested) > store.revision:
        raise errors.too_large_resource_version(int(requested), store.revision)
    items = store.list(info.name, target.namespace, match)
    meta: dict[str, Any] = {"resourceVersion": str(store.revision)}
    start = _continue_start(backend, query["continue"]) if query.get("continue") else ""
    if start:
        items = [o for o in items if _sort_key(o) > start]
    limit = int(query.get("limit") or 0)
    if limit > 0 and len(items) > limit:
        token = json.dumps({"rv": store.revision, "start": _sort_key(items[limit - 1])})
        meta["continue"] = base64.urlsafe_b64encode(token.encode()).decode()
        meta["remainingItemCount"] = len(items) - limit
        items = items[:limit]
    encoded = [_read(backend, target, o) for o in items]
    for item in encoded:
        item.pop("apiVersion", None)
        item.pop("kind", None)
    api_version = f"{info.group}/{target.version}" if info.group else target.version
    return json_response({"kind": info.list_kind(), "apiVersion": api_version, "metadata": meta,
                          "items": encoded})


def _sort_key(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata", {})
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _read(backend: Backend, target: Target, obj: dict[str, Any]) -> dict[str, Any]:
    if target.info is NODES or target.info is events_api.EVENTS:
        return obj
    return backend.registry.read(target.info.name, target.version, obj)


async def resource_response(backend: Backend, request: web.Request, target: Target,
                            body: Any, entry: LoggedRequest) -> web.StreamResponse:
    info, query, registry = target.info, request.query, backend.registry
    verb, name, namespace = target.verb, target.name, target.namespace
    if info is NODES and (verb not in ("get", "list", "watch", "patch", "update")
                          or target.subresource):
        raise errors.method_not_supported("nodes", "", verb)
    if info is NODES and verb == "patch":
        return json_response(backend.nodes.patch(name, request.headers.get("Content-Type", ""),
                                                  body))
    if info is NODES and verb == "update":
        return json_response(backend.nodes.update(name, body))
    if info is events_api.EVENTS:
        return _events_response(backend, request, target, body)
    if info is CONFIGMAPS and verb == "list":
        return json_response(backend.core.config_maps(namespace or "",
                                                      query.get("labelSelector", "")))
    if info in (NAMESPACES, CONFIGMAPS):
        if verb != "get":
            raise errors.method_not_supported(info.name, "", verb)
        return json_response(backend.core.namespace(name) if info is NAMESPACES
                             else backend.core.config_map(namespace or "", name))
    if verb == "get":
        found = backend.store.get(info.name, namespace, name)
        if found is None:
            raise errors.not_found(info.name, info.group, name)
        return json_response(_read(backend, target, found))
    if verb == "list":
        return list_response(backend, target, query)
    if verb == "watch":
        from compat_tests.apiserver.watch import serve_watch

        return await serve_watch(backend, request, target, entry)
    validation, dry_run = _options(query, backend)
    status = target.subresource == "status"
    if verb == "create" and not name:
        obj, warnings = registry.create(info.name, target.version, body, namespace, validation,
                                        dry_run)
        return json_response(obj, 201, warnings)
    authorize = None
    if status and info.name == "resourceclaims" and backend.model.enabled(claim_authz.GATE):
        authorize = claim_authz.authorizer(backend.faults, entry.user, verb, namespace or "",
                                           name)
    if verb == "update":
        obj, warnings = registry.update(info.name, target.version, name, body, namespace,
                                        validation, dry_run, status, authorize)
        return json_response(obj, 200, warnings)
    if verb == "patch":
        content_type = request.headers.get("Content-Type", "")
        obj, warnings = registry.patch(
            info.name, target.version, name, content_type, body, namespace, validation,
            dry_run, status, field_manager=query.get("fieldManager", ""),
            force=query.get("force") == "true", authorize=authorize)
        return json_response(obj, 200, warnings)
    if verb == "delete" and not status:
        return json_response(registry.delete(info.name, target.version, name, namespace,
                                             body if isinstance(body, dict) else None, dry_run))
    if verb == "deletecollection":
        match = selectors.predicate(info, target.version, query)
        items = registry.delete_collection(info.name, target.version, namespace, match,
                                           body if isinstance(body, dict) else None, dry_run)
        for item in items:
            item.pop("apiVersion", None)
            item.pop("kind", None)
        return json_response({"kind": info.list_kind(), "apiVersion": f"{GROUP}/{target.version}",
                              "metadata": {}, "items": items})
    raise errors.method_not_supported(info.name, info.group, verb)


def _events_response(backend: Backend, request: web.Request, target: Target,
                     body: Any) -> web.StreamResponse:
    verb, name, namespace = target.verb, target.name, target.namespace or ""
    store = backend.events
    if verb == "get":
        found = backend.store.get("events", namespace, name)
        if found is None:
            raise errors.not_found("events", events_api.GROUP, name)
        return json_response(found)
    if verb == "list":
        return list_response(backend, target, request.query)
    if verb == "create" and not name and namespace:
        return json_response(store.create(namespace, body), 201)
    if verb == "patch" and namespace:
        return json_response(store.patch(namespace, name, request.headers.get(
            "Content-Type", ""), body))
    if verb == "delete" and namespace:
        return json_response(store.delete(namespace, name))
    raise errors.method_not_supported("events", events_api.GROUP, verb)


async def handle(backend: Backend, request: web.Request) -> web.StreamResponse:
    """Answer one API request and log it."""
    entry = LoggedRequest(request.method, request.path, dict(request.query))
    backend.requests.append(entry)
    try:
        response = await _answer(backend, request, entry)
    except errors.ApiError as err:
        response = error_response(err)
    if entry.status is None:
        entry.status = response.status
    if isinstance(response, web.Response) and "Warning" in response.headers:
        entry.warnings = response.headers.getall("Warning")
    return response


async def _answer(backend: Backend, request: web.Request,
                  entry: LoggedRequest) -> web.StreamResponse:
    if backend.faults.delay > 0:
        await asyncio.sleep(backend.faults.delay)
    body = await read_body(request, entry) if request.method in (
        "POST", "PUT", "PATCH", "DELETE") else None
    user = backend.tokens.user(request.headers.get("Authorization"))
    if user is None:
        raise errors.unauthorized()
    entry.user = user
    target = parse_target(request, backend.model)
    if isinstance(target, web.Response):
        return target
    if target is None:
        injected = backend.faults.take(entry.verb or "get", "")
        if injected is not None:
            raise injected
        found = discovery_response(backend, request.path)
        return found if found is not None else page_not_found()
    entry.verb, entry.resource, entry.subresource = target.verb, target.info.name, \
        target.subresource
    entry.namespace, entry.name, entry.version = target.namespace or "", target.name, \
        target.version
    gate(backend, request, target, entry)
    slow = backend.faults.slowness(target.verb, target.info.name)
    if slow > 0:
        await asyncio.sleep(slow)
    return await resource_response(backend, request, target, body, entry)
