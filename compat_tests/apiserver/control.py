"""The control API: faults and fixtures over HTTP, for a test whose emulator runs elsewhere.

Served under ``/_emulator/`` (a path no API server serves) on the API port, and on the control
port when one is asked for, which stays up while the API port is down. No authentication: it
listens on 127.0.0.1 only. Every answer is JSON.

- ``GET  /_emulator/state``: model, served versions, port, up or down, revision, object counts
- ``GET  /_emulator/requests`` (``DELETE`` clears): the request log
- ``POST /_emulator/faults``: ``{"delay": s}``, ``{"fail_next": {"count", "status",
  "retry_after", "verb", "resource", "message"}}``, ``{"conflict_next": n}``,
  ``{"deny": [[verb, resource]...]}``, ``{"allow": [...]}``, ``{"end_watches_at_once": bool}``,
  ``{"slow": [[verb, resource, seconds]...]}`` (0 seconds: no longer),
  ``{"clear": true}``
- ``POST /_emulator/down``, ``POST /_emulator/up``, ``POST /_emulator/outage {"seconds": s}``
- ``POST /_emulator/restart {"model", "runtime_config", "feature_gates", "down_for"}``
- ``POST /_emulator/watches/end``, ``POST /_emulator/expire {"revision": optional}``
- ``POST /_emulator/tokens {"tokens": {token: user}}``
- ``POST /_emulator/nodes {"name", "labels", "runtime"}``, ``POST /_emulator/namespaces {"name"}``
- ``POST /_emulator/nodes/label {"name", "key", "value"}`` (``value`` null removes it)
- ``POST /_emulator/nodes/runtime {"name", "runtime"}`` (the kubelet's containerRuntimeVersion)
- ``POST /_emulator/objects`` any v1 object; ``POST /_emulator/claims/allocated`` with the
  arguments of ``create_allocated_claim``; ``POST /_emulator/claims/status {"namespace",
  "name", "status"}``
- ``POST /_emulator/validate {"object", "version"}``: ``{"errors": [...]}``
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from compat_tests.apiserver import errors, objects

if TYPE_CHECKING:
    from compat_tests.apiserver.server import ApiServerEmulator

PREFIX = "/_emulator"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _state(api: ApiServerEmulator) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for resource, _, _ in api.store.objects:
        counts[resource] = counts.get(resource, 0) + 1
    return {"model": api.model.name, "served": list(api.model.served), "url": api.url,
            "up": api.is_up, "revision": api.store.revision, "compacted": api.store.compacted,
            "objects": counts, "watches": len(api.store.watchers), "token": api.token,
            "ca_file": str(api.ca_file) if api.ca_file else None}


def add_control_routes(app: web.Application, api: ApiServerEmulator, prefix: str = PREFIX) -> None:
    def route(method: str, path: str, action: Callable[[dict[str, Any]], Any]) -> None:
        async def handler(request: web.Request) -> web.StreamResponse:
            body = await request.json() if request.can_read_body else {}
            try:
                result = action(body if isinstance(body, dict) else {})
                if asyncio.iscoroutine(result):
                    result = await result
            except errors.ApiError as err:
                return web.json_response(err.status, status=err.code if err.code >= 400 else 400)
            except (KeyError, TypeError, ValueError) as err:
                return web.json_response({"error": str(err)}, status=400)
            return web.json_response(result if result is not None else {"ok": True})

        app.router.add_route(method, prefix + path, handler)

    route("GET", "/state", lambda b: _state(api))
    route("GET", "/requests", lambda b: [r.as_dict() for r in api.requests])
    route("DELETE", "/requests", lambda b: api.clear_requests())
    route("POST", "/faults", lambda b: _faults(api, b))
    # Taking the API port down from a request on that port must not wait for that request.
    route("POST", "/down", lambda b: _soon(api, api.go_down()))
    route("POST", "/up", lambda b: api.come_back())
    route("POST", "/outage", lambda b: _soon(api, api.outage(float(b["seconds"]))))
    route("POST", "/restart", lambda b: _soon(api, api.restart(
        b.get("model"), runtime_config=b.get("runtime_config"),
        feature_gates=b.get("feature_gates"), down_for=float(b.get("down_for", 0)))))
    route("POST", "/watches/end", lambda b: {"ended": api.end_watches()})
    route("POST", "/expire", lambda b: api.expire_resource_versions(b.get("revision")))
    route("POST", "/tokens", lambda b: api.set_tokens(b["tokens"]))
    route("POST", "/nodes", lambda b: api.create_node(
        b["name"], b.get("labels"), b.get("runtime", objects.DEFAULT_RUNTIME)))
    route("POST", "/nodes/runtime", lambda b: api.set_node_runtime(b["name"], b["runtime"]))
    route("POST", "/nodes/label", lambda b: api.label_node(b["name"], b["key"], b.get("value")))
    route("POST", "/namespaces", lambda b: api.create_namespace(b["name"]))
    route("POST", "/objects", lambda b: api.create(b))
    route("POST", "/claims/allocated", lambda b: api.create_allocated_claim(**b))
    route("POST", "/claims/status", lambda b: api.set_claim_status(
        b["namespace"], b["name"], b["status"]))
    route("POST", "/validate", lambda b: {"errors": api.validate(b["object"], b.get("version"))})


_pending: set[asyncio.Task[Any]] = set()


def _soon(api: ApiServerEmulator, action: Awaitable[Any]) -> dict[str, Any]:
    """Run ``action`` after this answer is sent; the reply says it is scheduled."""

    async def later() -> None:
        await asyncio.sleep(0.05)
        await action

    task = asyncio.get_running_loop().create_task(later())
    _pending.add(task)
    task.add_done_callback(_pending.discard)
    return {"scheduled": True}


def _faults(api: ApiServerEmulator, body: dict[str, Any]) -> dict[str, Any]:
    if body.get("clear"):
        api.faults.clear()
        api.registry.conflicts_pending = 0
    if "delay" in body:
        api.faults.delay = float(body["delay"])
    if "fail_next" in body:
        spec = dict(body["fail_next"])
        api.faults.fail_next(int(spec.pop("count", 1)), int(spec.pop("status")), **spec)
    if "conflict_next" in body:
        api.conflict_next(int(body["conflict_next"]))
    if "end_watches_at_once" in body:
        api.faults.end_watches_at_once = bool(body["end_watches_at_once"])
    for verb, resource in body.get("deny", []):
        api.faults.deny(verb, resource)
    for verb, resource in body.get("allow", []):
        api.faults.allow(verb, resource)
    for verb, resource, seconds in body.get("slow", []):
        api.faults.slow_down(verb, resource, float(seconds))
    return {"delay": api.faults.delay, "pending_failures": len(api.faults.rules),
            "denied": sorted(api.faults.denied), "conflicts": api.registry.conflicts_pending,
            "end_watches_at_once": api.faults.end_watches_at_once,
            "slow": [[v, r, s] for (v, r), s in sorted(api.faults.slow.items())]}


def control_app(api: ApiServerEmulator) -> web.Application:
    app = web.Application()
    add_control_routes(app, api, PREFIX)
    return app
