"""Failure answers shaped like the API server's: a ``Status`` object with code, reason, details.

Clients branch on ``reason`` and ``code`` (client-go's IsConflict, IsNotFound, IsGone...) and log
``message``, so both follow apimachinery ``pkg/api/errors/errors.go`` (NewNotFound,
NewAlreadyExists, NewConflict, NewInvalid, NewBadRequest, NewForbidden, NewResourceExpired,
NewTooManyRequests, ...) and the apiserver's ``OptimisticLockErrorMsg``.
"""

from __future__ import annotations

from typing import Any

from compat_tests.apiserver.fielderrors import FieldError, aggregate

OPTIMISTIC_LOCK = ("the object has been modified; please apply your changes to the latest "
                   "version and try again")


class ApiError(Exception):
    """A request that ends in a Status; ``headers`` go with it (Retry-After, Warning)."""

    def __init__(self, status: dict[str, Any], headers: dict[str, str] | None = None,
                 text: str | None = None) -> None:
        super().__init__(status.get("message", ""))
        self.status = status
        self.headers = headers or {}
        self.text = text  # answered as text/plain instead of a Status (filters do that)

    @property
    def code(self) -> int:
        return int(self.status["code"])


def status(code: int, reason: str, message: str,
           details: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {},
                           "status": "Failure", "message": message}
    if reason:
        out["reason"] = reason  # StatusReasonUnknown ("") is omitted
    if details is not None:
        out["details"] = details
    out["code"] = code
    return out


def qualified(resource: str, group: str) -> str:
    return f"{resource}.{group}" if group else resource


def _details(resource: str, group: str, name: str) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name} if name else {}
    if group:
        details["group"] = group
    details["kind"] = resource
    return details


def not_found(resource: str, group: str, name: str) -> ApiError:
    return ApiError(status(404, "NotFound", f'{qualified(resource, group)} "{name}" not found',
                           _details(resource, group, name)))


def path_not_found() -> ApiError:
    return ApiError(status(404, "NotFound", "the server could not find the requested resource",
                           {}))


def already_exists(resource: str, group: str, name: str) -> ApiError:
    return ApiError(status(409, "AlreadyExists",
                           f'{qualified(resource, group)} "{name}" already exists',
                           _details(resource, group, name)))


def conflict(resource: str, group: str, name: str, reason: str = OPTIMISTIC_LOCK) -> ApiError:
    return ApiError(status(
        409, "Conflict",
        f'Operation cannot be fulfilled on {qualified(resource, group)} "{name}": {reason}',
        _details(resource, group, name)))


def invalid(kind: str, group: str, name: str, errors: list[FieldError]) -> ApiError:
    group_kind = f"{kind}.{group}" if group else kind
    details: dict[str, Any] = {"name": name, "group": group, "kind": kind,
                               "causes": [e.cause() for e in errors]}
    if not group:
        del details["group"]
    return ApiError(status(422, "Invalid",
                           f'{group_kind} "{name}" is invalid: {aggregate(errors)}', details))


def bad_request(message: str) -> ApiError:
    return ApiError(status(400, "BadRequest", message))


def forbidden(resource: str, group: str, name: str, message: str) -> ApiError:
    target = qualified(resource, group)
    prefix = f'{target} "{name}"' if name else target
    return ApiError(status(403, "Forbidden", f"{prefix} is forbidden: {message}",
                           _details(resource, group, name)))


def unauthorized() -> ApiError:
    return ApiError(status(401, "Unauthorized", "Unauthorized"))


def expired(message: str) -> ApiError:
    return ApiError(status(410, "Expired", message))


def too_many_requests(retry_after: int) -> ApiError:
    """Priority and fairness (and max-in-flight) reject with plain text, not a Status
    (apiserver ``pkg/server/filters/priority-and-fairness.go`` tooManyRequests)."""
    message = "Too many requests, please try again later."
    return ApiError(status(429, "TooManyRequests", message, {"retryAfterSeconds": retry_after}),
                    {"Retry-After": str(retry_after)}, text=message + "\n")


def service_unavailable(message: str = "the server is currently unable to handle the request"
                        ) -> ApiError:
    return ApiError(status(503, "ServiceUnavailable", message))


def internal(message: str) -> ApiError:
    return ApiError(status(500, "InternalError", f"Internal error occurred: {message}",
                           {"causes": [{"message": message}]}))


def method_not_supported(resource: str, group: str, verb: str) -> ApiError:
    return ApiError(status(405, "MethodNotAllowed",
                           f"{verb} is not supported on resources of kind "
                           f'"{qualified(resource, group)}"', _details(resource, group, "")))


def too_large_resource_version(requested: int, current: int) -> ApiError:
    return ApiError(status(504, "Timeout",
                           f"Too large resource version: {requested}, current: {current}",
                           {"causes": [{"reason": "ResourceVersionTooLarge",
                                        "message": "Too large resource version"}],
                            "retryAfterSeconds": 1}))


def not_a_status(message: str, code: int = 500) -> ApiError:
    """An error the storage layer raises as a plain Go error: reason unknown, message as is."""
    return ApiError(status(code, "", message))


def for_code(code: int, retry_after: int = 1, message: str = "") -> ApiError:
    """An injected failure of HTTP status ``code``, shaped as the server would send it."""
    if code == 429:
        return too_many_requests(retry_after)
    if code == 503:
        return service_unavailable(message or "the server is currently unable to handle the "
                                   "request")
    if code == 500:
        return internal(message or "injected fault")
    if code == 403:
        return ApiError(status(403, "Forbidden", message or "forbidden: injected fault"))
    if code == 409:
        return ApiError(status(409, "Conflict", message or OPTIMISTIC_LOCK))
    if code == 504:
        return ApiError(status(504, "Timeout", message or "request timed out"))
    if code == 401:
        return unauthorized()
    return ApiError(status(code, "Unknown", message or f"injected fault {code}"))
