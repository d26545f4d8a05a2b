"""PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902), strategic merge patch.

A strategic merge patch differs from a merge patch only for lists the schema marks with
``x-kubernetes-patch-strategy: merge`` (merged by ``x-kubernetes-patch-merge-key``, or as a set
for primitives) and for ``$patch`` directives; every other list of these kinds is atomic and
replaced. Server-side apply (``application/apply-patch+yaml``) is emulated for a claim's
``status`` only (apply.py); anywhere else it answers 415.
"""

from __future__ import annotations

import copy
from typing import Any

from compat_tests.apiserver import errors, schema

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"
ACCEPTED = (JSON_PATCH, MERGE, APPLY)


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise errors.ApiError(errors.status(422, "", f"invalid JSON pointer: {path}"))
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc: Any, parts: list[str]) -> tuple[Any, str]:
    for part in parts[:-1]:
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc, parts[-1]


def json_patch(doc: Any, operations: Any) -> Any:
    """RFC 6902; a failing operation answers 422 like the server's jsonpatch errors."""
    if not isinstance(operations, list):
        raise errors.bad_request("json: cannot unmarshal object into Go value of type "
                                 "jsonpatch.Patch")
    doc = copy.deepcopy(doc)
    for op in operations:
        try:
            doc = _apply_op(doc, op)
        except (KeyError, IndexError, ValueError, TypeError) as err:
            raise errors.ApiError(errors.status(
                422, "", f"the server rejected our request due to an error in our request: "
                f"{op.get('op') if isinstance(op, dict) else op} operation failed: {err}")) from err
    return doc


def _apply_op(doc: Any, op: dict[str, Any]) -> Any:
    kind, parts = op["op"], _pointer(op["path"])
    if kind == "test":
        parent, last = _walk(doc, parts) if parts else (None, "")
        current = doc if not parts else (parent[int(last)] if isinstance(parent, list)
                                         else parent[last])
        if current != op.get("value"):
            raise ValueError(f"testing value {op['path']} failed")
        return doc
    if kind in ("move", "copy"):
        src_parent, src_last = _walk(doc, _pointer(op["from"]))
        index: Any = int(src_last) if isinstance(src_parent, list) else src_last
        value = copy.deepcopy(src_parent[index])
        if kind == "move":
            del src_parent[index]
        return _apply_op(doc, {"op": "add", "path": op["path"], "value": value})
    if not parts:
        return copy.deepcopy(op.get("value")) if kind in ("add", "replace") else None
    parent, last = _walk(doc, parts)
    if isinstance(parent, list):
        position = len(parent) if last == "-" else int(last)
        if kind == "add":
            parent.insert(position, copy.deepcopy(op["value"]))
        elif kind == "remove":
            del parent[position]
        elif kind == "replace":
            parent[position] = copy.deepcopy(op["value"])
        else:
            raise ValueError(f"unknown op {kind}")
        return doc
    if kind == "add":
        parent[last] = copy.deepcopy(op["value"])
    elif kind == "remove":
        del parent[last]
    elif kind == "replace":
        if last not in parent:
            raise KeyError(f"replace operation does not apply: doc is missing key: {op['path']}")
        parent[last] = copy.deepcopy(op["value"])
    else:
        raise ValueError(f"unknown op {kind}")
    return doc


def strategic_merge(target: Any, patch: Any, schema_node: dict[str, Any] | None,
                    schemas: dict[str, Any]) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    node = _resolve(schema_node, schemas)
    if patch.get("$patch") == "replace":
        return {k: v for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    props = node.get("properties", {}) if node else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        prop = props.get(key) or (node or {}).get("additionalProperties")
        prop = prop if isinstance(prop, dict) else None
        if value is None:
            out.pop(key, None)
        elif isinstance(value, list) and prop and prop.get(
                "x-kubernetes-patch-strategy") == "merge":
            out[key] = _merge_list(out.get(key), value, prop, schemas)
        else:
            merged = strategic_merge(out.get(key), value, prop, schemas)
            if merged is None and isinstance(value, dict):
                out.pop(key, None)
            else:
                out[key] = merged
    return out


def _resolve(node: dict[str, Any] | None, schemas: dict[str, Any]) -> dict[str, Any] | None:
    if node is None:
        return None
    name = schema._ref_name(node)
    return schemas.get(name, node) if name else node


def _merge_list(current: Any, patch: list[Any], prop: dict[str, Any],
                schemas: dict[str, Any]) -> list[Any]:
    current = copy.deepcopy(current) if isinstance(current, list) else []
    key = prop.get("x-kubernetes-patch-merge-key")
    if key is None:  # a set of primitives
        return current + [v for v in patch if v not in current]
    for item in patch:
        if not isinstance(item, dict):
            continue
        index = next((i for i, c in enumerate(current)
                      if isinstance(c, dict) and c.get(key) == item.get(key)), None)
        if item.get("$patch") == "delete":
            if index is not None:
                del current[index]
        elif index is None:
            current.append({k: v for k, v in item.items() if not k.startswith("$")})
        else:
            current[index] = strategic_merge(current[index], item, prop.get("items"), schemas)
    return current


def apply(content_type: str, current: dict[str, Any], body: Any, resource: str,
          version: str, release: str = schema.DEFAULT_RELEASE) -> Any:
    """``current`` (as the client reads it in ``version``) with the PATCH body applied."""
    kind = content_type.split(";")[0].strip()
    if kind == MERGE:
        return merge_patch(current, body)
    if kind == JSON_PATCH:
        return json_patch(current, body)
    if kind == STRATEGIC:
        schemas = schema.load(version, release)
        root = {"$ref": "#/" + schema.definition_name(version, schema.kind_of(resource))}
        return strategic_merge(current, body, root, schemas)
    raise errors.ApiError(errors.status(
        415, "UnsupportedMediaType", f"the body of the request was in an unknown format - "
        f"accepted media types include: {', '.join(ACCEPTED)}"))
