"""Faults a test turns on, the identities the server accepts, and the log of every request.

Kept apart from the HTTP code so the same state is driven in-process (``emulator.faults``) and
over the control API (control.py). A request passes these gates in the server's order:
authentication (401 without a known bearer token), then injected failures (what a load balancer,
priority and fairness (429 with Retry-After) or an overloaded server answers), then
authorization (403 for the denied (verb, resource) pairs, worded as RBAC words it).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from compat_tests.apiserver import errors

DEFAULT_USER = "system:serviceaccount:kube-system:dra-driver"


@dataclass
class LoggedRequest:
    """One request as the server saw it; ``status`` is filled in when the answer is decided."""

    method: str
    path: str
    query: dict[str, str]
    verb: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    version: str = ""
    user: str = ""
    body: Any = None
    status: int | None = None
    warnings: list[str] = field(default_factory=list)
    time: float = field(default_factory=time.time)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class FailRule:
    remaining: int
    status: int
    retry_after: int = 1
    verb: str | None = None
    resource: str | None = None
    message: str = ""

    def matches(self, verb: str, resource: str) -> bool:
        """``resource`` is "" for a non-resource path (discovery, /version): only rules
        without a resource match it, as a failing load balancer fails every path."""
        return self.remaining > 0 and self.verb in (None, verb) and self.resource in (
            None, resource or None, resource.split("/")[0] or None)


class Faults:
    """Mutable fault state; every method is safe to call between requests."""

    def __init__(self) -> None:
        self.delay = 0.0
        self.rules: list[FailRule] = []
        self.denied: set[tuple[str, str]] = set()
        self.end_watches_at_once = False
        """Every watch ends cleanly right after its backlog, as behind a proxy whose
        timeout is shorter than any watch."""
        self.slow: dict[tuple[str, str], float] = {}
        """Seconds a (verb, resource) request waits after authorization before it is
        answered: an overloaded resource (``"*"`` for any verb)."""

    def slow_down(self, verb: str, resource: str, seconds: float) -> None:
        """Requests of ``verb`` on ``resource`` wait ``seconds`` (0 to stop); a long wait is
        a hang as the client sees it."""
        if seconds > 0:
            self.slow[(verb, resource)] = seconds
        else:
            self.slow.pop((verb, resource), None)

    def slowness(self, verb: str, resource: str) -> float:
        return max((s for (v, r), s in self.slow.items() if v in ("*", verb) and r == resource),
                   default=0.0)

    def fail_next(self, count: int, status: int, *, retry_after: int = 1,
                  verb: str | None = None, resource: str | None = None,
                  message: str = "") -> None:
        """The next ``count`` matching API requests answer ``status`` (500, 503, 429, 403...)."""
        self.rules.append(FailRule(count, status, retry_after, verb, resource, message))

    def take(self, verb: str, resource: str) -> errors.ApiError | None:
        for rule in self.rules:
            if rule.matches(verb, resource):
                rule.remaining -= 1
                self.rules = [r for r in self.rules if r.remaining > 0]
                return errors.for_code(rule.status, rule.retry_after, rule.message)
        return None

    def deny(self, verb: str, resource: str) -> None:
        """RBAC refuses ``verb`` on ``resource`` (``"resourceclaims/status"``; ``"*"`` for any)."""
        self.denied.add((verb, resource))

    def allow(self, verb: str, resource: str) -> None:
        self.denied.discard((verb, resource))

    def is_denied(self, verb: str, resource: str) -> bool:
        return any(v in ("*", verb) and r in ("*", resource) for v, r in self.denied)

    def clear(self) -> None:
        self.delay = 0.0
        self.rules.clear()
        self.denied.clear()
        self.slow.clear()
        self.end_watches_at_once = False


def forbidden_message(user: str, verb: str, resource: str, subresource: str, group: str,
                      namespace: str) -> str:
    """RBAC's wording (apiserver ``responsewriters.forbiddenMessage``)."""
    target = f"{resource}/{subresource}" if subresource else resource
    scope = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
    return f'User "{user}" cannot {verb} resource "{target}" in API group "{group}" {scope}'


class Tokens:
    """Bearer tokens the server accepts and the user each one authenticates as."""

    def __init__(self, tokens: Mapping[str, str] | Iterable[str]) -> None:
        self.users: dict[str, str] = {}
        self.set(tokens)

    def set(self, tokens: Mapping[str, str] | Iterable[str]) -> None:
        if isinstance(tokens, Mapping):
            self.users = dict(tokens)
        else:
            self.users = dict.fromkeys(tokens, DEFAULT_USER)

    def user(self, authorization: str | None) -> str | None:
        if not authorization or not authorization.startswith("Bearer "):
            return None
        return self.users.get(authorization[len("Bearer "):].strip())

    @property
    def first(self) -> str:
        return next(iter(self.users), "")
