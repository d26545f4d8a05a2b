"""The kubelet's Registration service: checks a RegisterRequest the way the kubelet does.

Only the service of the emulated generation is served. Every other path is answered like
grpc-go answers it (UNIMPLEMENTED, ``unknown service deviceplugin.Registration``), since
that is the signal a multi-generation plugin sees from a real kubelet of another version.
Refusals use gRPC code UNKNOWN, which is what grpc-go sends for the kubelet's plain errors.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from api_versions.wire import WireApi, rpc_handler
from compat_tests.kubelet import translate
from compat_tests.kubelet.models import KubeletModel

log = logging.getLogger(__name__)

_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUOTA_PREFIX = "requests."


def is_extended_resource_name(name: str) -> bool:
    """The kubelet's rule: ``<DNS subdomain>/<name>``, outside kubernetes.io, quota-safe."""
    if "/" not in name or "kubernetes.io/" in name or name.startswith(_QUOTA_PREFIX):
        return False
    # The kubelet checks the name as it would appear in a quota: "requests.<name>".
    parts = (_QUOTA_PREFIX + name).split("/")
    if len(parts) != 2:
        return False
    prefix, short = parts
    if len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix):
        return False
    return len(short) <= 63 and bool(_QUALIFIED_NAME.match(short))


class RegistrationRefused(Exception):
    """Register must fail with this message (the kubelet's own wording)."""


Accept = Callable[[translate.RegisterFields], Awaitable[None]]
Refuse = Callable[[translate.RegisterFields, str], None]


class RegistrationService:
    """Register of one generation: version check, name check, then hand over to ``accept``."""

    def __init__(
        self,
        model: KubeletModel,
        wire: WireApi,
        accept: Accept,
        refuse: Refuse,
        *,
        accept_no_version: bool = False,
        hang: bool = False,
        on_call: Callable[[], None] = lambda: None,
    ) -> None:
        self.model = model
        self.wire = wire
        self._accept = accept
        self._refuse = refuse
        self.supported_versions = () if accept_no_version else model.table.supported_versions
        self._hang = hang
        self._answers_open = asyncio.Event()
        self._answers_open.set()
        self.calls = 0
        self._on_call = on_call

    def hold_answers(self) -> None:
        """Keep every Register from now on waiting until :meth:`release_answers`: a
        kubelet busy elsewhere, so a test can act while a registration is in flight."""
        self._answers_open.clear()

    def release_answers(self) -> None:
        self._answers_open.set()

    def check(self, fields: translate.RegisterFields) -> str | None:
        """The kubelet's refusal message for ``fields``, or None if it passes the checks."""
        if fields.version not in self.supported_versions:
            return self.model.table.version_error(fields.version, self.supported_versions)
        if not is_extended_resource_name(fields.resource_name):
            return self.model.table.resource_name_error(fields.resource_name)
        return None

    async def register(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.calls += 1
        self._on_call()
        fields = translate.register_fields(self.model, request)
        log.info(
            "kubelet %s: Register %s version=%r endpoint=%r",
            self.model.name, fields.resource_name, fields.version, fields.endpoint,
        )
        if self._hang:
            log.info("kubelet %s: holding Register without an answer", self.model.name)
            await asyncio.Event().wait()
        if not self._answers_open.is_set():
            log.info("kubelet %s: holding Register until released", self.model.name)
            await self._answers_open.wait()
        problem = self.check(fields)
        if problem is None:
            try:
                await self._accept(fields)
            except RegistrationRefused as exc:
                problem = str(exc)
        if problem is not None:
            self._refuse(fields, problem)
            log.info("kubelet %s: refused %s: %s", self.model.name, fields.resource_name, problem)
            await context.abort(grpc.StatusCode.UNKNOWN, problem)
        return self.wire.new("Empty")

    def handlers(self) -> list[grpc.GenericRpcHandler]:
        """The generic handlers to install: this generation's service, then the catch-all."""
        method = self.wire.method("Registration", "Register")
        service = self.wire.service("Registration").full_name
        own = grpc.method_handlers_generic_handler(
            service, {"Register": rpc_handler(method, self.register)}
        )
        return [own, UnknownServiceHandler(frozenset({service}))]


class UnknownServiceHandler(grpc.GenericRpcHandler):
    """Answers every path no other handler took with grpc-go's UNIMPLEMENTED wording."""

    def __init__(self, known_services: frozenset[str]) -> None:
        self._known = known_services

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        path: str = handler_call_details.method  # type: ignore[attr-defined]
        service, _, name = path.lstrip("/").rpartition("/")
        if service in self._known:
            message = f"unknown method {name} for service {service}"
        else:
            message = f"unknown service {service}"

        async def refuse(_request: bytes, context: grpc.aio.ServicerContext) -> None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, message)

        return grpc.unary_unary_rpc_method_handler(refuse)
