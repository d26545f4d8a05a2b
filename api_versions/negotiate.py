"""Find the newest generation the kubelet accepts, without hammering it or giving up.

Three kinds of answer, three reactions:

* "not this version" (gRPC UNIMPLEMENTED because the kubelet serves another proto package, or
  the kubelet's own unsupported-version error): move to the next generation at once;
* transient (kubelet.sock absent, connection refused, UNAVAILABLE, DEADLINE_EXCEEDED): retry
  the same generation with tenacity (exponential backoff with jitter, bounded), because the
  other generations would meet the same absent kubelet;
* anything else (a bad resource name, say): the kubelet refused us; report it.

A round ends either registered or with an exception saying why; the caller decides when to start
another round (see ``plugin.serving.deviceplugin.server``), so this module never loops forever.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import grpc
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)

from api_versions.adapter import Adapter, ServedResource
from api_versions.retry import RetryPolicy
from api_versions.v1alpha1 import V1Alpha1
from api_versions.v1alpha2 import V1Alpha2
from api_versions.v1beta1 import V1Beta1
from api_versions.wire import client_call

log = logging.getLogger(__name__)

KUBELET_SOCKET = "kubelet.sock"
ADAPTER_CLASSES: tuple[type[Adapter], ...] = (V1Beta1, V1Alpha2, V1Alpha1)
_VERSION_REFUSALS = ("not supported by kubelet", "unsupported api version")
_TRANSIENT_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
FRESH_CONNECTION = (("grpc.use_local_subchannel_pool", 1),)
"""gRPC shares connections to one address between channels, and with them the reconnect
back-off of a failed one (up to two minutes): a kubelet that refused connections while it
was down would then be "unreachable" for a while after it is back. Each Register dials anew."""


class NegotiationError(Exception):
    """A round that ended without a registration."""


class NotThisVersion(NegotiationError):
    pass


class TransientFailure(NegotiationError):
    pass


class RegistrationRefused(NegotiationError):
    """The kubelet understood the generation but refused the registration itself."""

    def __init__(self, generation: str, detail: str) -> None:
        super().__init__(f"kubelet refused registration through {generation}: {detail}")
        self.generation = generation
        self.detail = detail


class KubeletUnreachable(NegotiationError):
    def __init__(self, generation: str, detail: str, attempts: int) -> None:
        super().__init__(
            f"kubelet unreachable after {attempts} tries of {generation}: {detail}"
        )
        self.detail = detail


class Withdrawn(NegotiationError):
    """The caller stopped wanting the registration (the plugin is stopping) mid-round."""

    def __init__(self, generation: str, answered: bool) -> None:
        when = "answered" if answered else "about to be offered"
        super().__init__(f"registration through {generation} {when} after the plugin began "
                         "stopping; not holding it")
        self.generation = generation


class NoGenerationAccepted(NegotiationError):
    def __init__(self, tried: Sequence[tuple[str, str]]) -> None:
        answers = "; ".join(f"{name}: {detail}" for name, detail in tried)
        super().__init__(f"the kubelet accepted none of the generations tried ({answers})")
        self.tried = tuple(tried)


def adapters(names: Iterable[str] | None = None) -> list[Adapter]:
    """Adapters for ``names`` in the order given, or every generation newest first."""
    by_name = {cls.name: cls for cls in ADAPTER_CLASSES}
    if names is None:
        return sorted((cls() for cls in ADAPTER_CLASSES), key=lambda a: a.order, reverse=True)
    chosen = []
    for name in names:
        if name not in by_name:
            raise ValueError(f"unknown API generation {name!r}; known: {', '.join(by_name)}")
        chosen.append(by_name[name]())
    return chosen


def classify(error: grpc.aio.AioRpcError, generation: str) -> NegotiationError:
    """Map one failed Register call onto the three reactions described above."""
    code = error.code()
    detail = f"{code.name}: {error.details() or ''}".rstrip(": ")
    if code is grpc.StatusCode.UNIMPLEMENTED:
        return NotThisVersion(detail)
    if code in _TRANSIENT_CODES:
        return TransientFailure(detail)
    if any(text in (error.details() or "").lower() for text in _VERSION_REFUSALS):
        return NotThisVersion(detail)
    return RegistrationRefused(generation, detail)


async def register_once(
    directory: Path, adapter: Adapter, resource: ServedResource, endpoint: str, timeout: float
) -> None:
    """One Register call through ``adapter``; raises a NegotiationError on any failure."""
    kubelet = directory / KUBELET_SOCKET
    if not kubelet.exists():
        raise TransientFailure(f"{kubelet} does not exist (kubelet not running?)")
    request = adapter.register_request(resource, endpoint)
    target = f"unix://{kubelet.absolute()}"
    async with grpc.aio.insecure_channel(target, options=FRESH_CONNECTION) as channel:
        register = client_call(channel, adapter.register_method)
        try:
            await register(request, timeout=timeout)
        except grpc.aio.AioRpcError as error:
            raise classify(error, adapter.name) from None


async def negotiate(
    directory: Path,
    candidates: Sequence[Adapter],
    resource: ServedResource,
    endpoint: str,
    policy: RetryPolicy,
    before_attempt: Callable[[Adapter], None] = lambda _adapter: None,
    wanted: Callable[[], bool] = lambda: True,
) -> Adapter:
    """Register through the first of ``candidates`` the kubelet accepts and return it.

    ``before_attempt`` runs before each generation is offered: recent kubelets dial back
    during Register, so the plugin's socket must already answer in that generation.
    ``wanted`` is asked before every Register and once one succeeds: a plugin that began
    stopping meanwhile gets :class:`Withdrawn` rather than a registration to hold.
    """
    tried: list[tuple[str, str]] = []
    for adapter in candidates:
        before_attempt(adapter)
        try:
            await _register_with_retries(directory, adapter, resource, endpoint, policy,
                                         wanted)
        except NotThisVersion as refusal:
            log.info("kubelet does not speak %s (%s); trying the next generation",
                     adapter.name, refusal)
            tried.append((adapter.name, str(refusal)))
            continue
        except TransientFailure as failure:
            raise KubeletUnreachable(adapter.name, str(failure), policy.attempts) from None
        if not wanted():
            raise Withdrawn(adapter.name, answered=True)
        log.info("registered %s through API generation %s (endpoint %s)",
                 resource.resource_name, adapter.name, endpoint)
        return adapter
    raise NoGenerationAccepted(tried)


async def _register_with_retries(
    directory: Path, adapter: Adapter, resource: ServedResource, endpoint: str,
    policy: RetryPolicy, wanted: Callable[[], bool],
) -> None:
    def before_sleep(state: RetryCallState) -> None:
        outcome = state.outcome.exception() if state.outcome else None
        log.debug("Register through %s failed transiently (%s); retry %d in %.2fs",
                  adapter.name, outcome, state.attempt_number,
                  state.next_action.sleep if state.next_action else 0.0)

    retrying = AsyncRetrying(
        retry=retry_if_exception_type(TransientFailure),
        stop=stop_after_attempt(max(1, policy.attempts)),
        wait=wait_exponential_jitter(
            multiplier=policy.initial_backoff, max=policy.max_backoff, jitter=policy.jitter
        ),
        before_sleep=before_sleep,
        reraise=True,
    )
    async for attempt in retrying:
        with attempt:
            if not wanted():
                raise Withdrawn(adapter.name, answered=False)
            await register_once(directory, adapter, resource, endpoint,
                                policy.register_timeout)
