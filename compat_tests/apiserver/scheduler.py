"""The 1.36 kube-scheduler's dynamicresources plugin, for one pod with one claim on one node.

What a driver with binding conditions (KEP-5007) meets, from kubernetes/kubernetes
``pkg/scheduler/framework/plugins/dynamicresources/dynamicresources.go`` (1.36; the function
names are the citation, since line numbers move between patch releases):

* ``Filter``: an allocated claim whose binding failed (a failure condition True) or timed
  out is unavailable, and ``PostFilter`` deallocates it (``status.allocation``,
  ``reservedFor`` and ``devices`` cleared in one ``UpdateStatus``), after which the pod is
  scheduled again: a new allocation, where a device tainted meanwhile is not picked;
* ``Reserve`` then ``PreBind``'s ``bindClaim``: the allocation, the pod in ``reservedFor``
  and ``allocation.allocationTimestamp`` written in one status update (the claim is reserved
  *before* the wait);
* ``PreBind``: if any result carries ``bindingConditions``, a ``BindingConditionsPending``
  Event on the pod ("waiting for binding conditions for device on node <node>"), then
  ``wait.PollUntilContextTimeout(ctx, 5*time.Second, pl.bindingTimeout, true,
  isPodReadyForBinding)``: checked at once, then every 5 s; ``isClaimReadyForBinding``
  wants every binding condition True in the ``status.devices[]`` entry of the result's
  driver, pool and device (``getAllocatedDeviceStatus``), and fails at once on a failure
  condition True (``claim <name> binding failed: reason=..., message=...``);
  ``isClaimTimeout`` fails it once ``allocationTimestamp + bindingTimeout`` has passed
  (``bindingTimeout``: ``DynamicResourcesArgs.bindingTimeout``, default
  ``DynamicResourcesBindingTimeoutDefault`` = 600 s, ``pkg/scheduler/apis/config/
  types_pluginargs.go``);
* a failed PreBind: ``Unreserve`` removes the pod from ``reservedFor`` (a strategic merge
  patch), leaving the allocation for the next cycle's ``Filter``/``PostFilter`` above; the
  scheduler records ``FailedScheduling`` on the pod.

``poll`` and ``binding_timeout`` default to upstream's 5 s and 600 s; tests make them short.
Not modelled: several claims per pod, other nodes, the scheduling queue's back-off.
"""

from __future__ import annotations

import asyncio
import calendar
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from compat_tests.apiserver.allocate import AllocationError, allocate_claim
from compat_tests.apiserver.objects import pod_reference

if TYPE_CHECKING:
    from compat_tests.apiserver.server import ApiServerEmulator

Obj = dict[str, Any]
POLL = 5.0
BINDING_TIMEOUT = 600.0


@dataclass
class Scheduled:
    """What came of scheduling one pod."""

    bound: bool
    attempts: int
    devices: list[str] = field(default_factory=list)
    """The devices of each allocation tried, in order."""
    errors: list[str] = field(default_factory=list)
    """Each failed cycle's reason (PreBind's error, an allocation that found no device)."""


class BindingScheduler:
    """Schedules pods as 1.36's dynamicresources plugin does (see the module docstring)."""

    def __init__(self, api: ApiServerEmulator, *, poll: float = POLL,
                 binding_timeout: float = BINDING_TIMEOUT) -> None:
        self.api = api
        self.poll = poll
        self.binding_timeout = binding_timeout

    async def schedule(self, namespace: str, pod: str, claim: str, node: str, *,
                       pod_uid: str | None = None, attempts: int = 3) -> Scheduled:
        """Cycles until the pod binds (the claim reserved for it, its conditions True) or
        ``attempts`` cycles failed."""
        uid = pod_uid or str(uuid.uuid4())
        outcome = Scheduled(False, 0)
        while outcome.attempts < attempts:
            outcome.attempts += 1
            stored = self._claim(namespace, claim)
            if stored.get("status", {}).get("allocation"):
                if self._unavailable(stored):  # Filter, then PostFilter deallocates
                    self.api.set_claim_status(namespace, claim, {})
                    stored = self._claim(namespace, claim)
                else:
                    outcome.errors.append("claim allocated elsewhere")
                    continue
            try:  # Filter + Reserve + PreBind's bindClaim
                stored = allocate_claim(self.api, namespace, claim, node, status_extra={
                    "reservedFor": [pod_reference(pod, uid)],
                    "allocation": {"allocationTimestamp": _rfc3339(time.time())}})
            except AllocationError as exc:
                outcome.errors.append(str(exc))
                self._event(namespace, pod, uid, "Warning", "FailedScheduling", str(exc))
                continue
            results = stored["status"]["allocation"]["devices"]["results"]
            outcome.devices.append(",".join(r["device"] for r in results))
            error = await self._pre_bind(namespace, pod, uid, claim, node, results)
            if error is None:
                outcome.bound = True
                return outcome
            outcome.errors.append(error)
            self._unreserve(namespace, claim, uid)
            self._event(namespace, pod, uid, "Warning", "FailedScheduling",
                        f"running PreBind plugin \"DynamicResources\": {error}")
        return outcome

    async def _pre_bind(self, namespace: str, pod: str, uid: str, claim: str, node: str,
                        results: list[Obj]) -> str | None:
        if not any(r.get("bindingConditions") for r in results):
            return None
        self._event(namespace, pod, uid, "Normal", "BindingConditionsPending",
                    f"waiting for binding conditions for device on node {node}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.binding_timeout
        while True:
            stored = self._claim(namespace, claim)
            try:
                if _ready(stored):
                    return None
            except BindingFailed as failed:
                return str(failed)
            if self._timed_out(stored):
                return f"claim {claim} binding timeout"
            if loop.time() + self.poll > deadline:
                return "device binding timeout"
            await asyncio.sleep(self.poll)

    def _unavailable(self, claim: Obj) -> bool:
        try:
            return not _ready(claim) and self._timed_out(claim)
        except BindingFailed:
            return True

    def _timed_out(self, claim: Obj) -> bool:
        allocation = claim.get("status", {}).get("allocation") or {}
        stamp = allocation.get("allocationTimestamp")
        if not stamp or not any(r.get("bindingConditions")
                                for r in allocation.get("devices", {}).get("results", [])):
            return False
        since = calendar.timegm(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S"))
        return since + self.binding_timeout < time.time()

    def _unreserve(self, namespace: str, claim: str, uid: str) -> None:
        stored = self._claim(namespace, claim)
        status = dict(stored.get("status") or {})
        if not status.get("allocation"):
            return
        status["reservedFor"] = [r for r in status.get("reservedFor", []) if r["uid"] != uid]
        if not status["reservedFor"]:
            del status["reservedFor"]
        self.api.set_claim_status(namespace, claim, status)

    def _claim(self, namespace: str, name: str) -> Obj:
        stored = self.api.get("resourceclaims", name, namespace)
        if stored is None:
            raise KeyError(f"resourceclaim {namespace}/{name} not found")
        return stored

    def _event(self, namespace: str, pod: str, uid: str, kind: str, reason: str,
               note: str) -> None:
        self.api.events.create(namespace, {
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": f"{pod}.{uuid.uuid4().hex[:16]}", "namespace": namespace},
            "eventTime": _rfc3339(time.time(), micro=True), "type": kind, "reason": reason,
            "action": "Scheduling", "note": note[:1024],
            "reportingController": "default-scheduler",
            "reportingInstance": "default-scheduler-emulated",
            "regarding": {"apiVersion": "v1", "kind": "Pod", "namespace": namespace,
                          "name": pod, "uid": uid}})


class BindingFailed(Exception):
    """A binding failure condition is True (``isClaimReadyForBinding``'s error)."""


def _ready(claim: Obj) -> bool:
    """``isClaimReadyForBinding``: :class:`BindingFailed` on a failure condition True."""
    status = claim.get("status", {})
    allocation = status.get("allocation")
    if not allocation:
        return False
    for result in allocation.get("devices", {}).get("results", []):
        if not result.get("bindingConditions"):
            continue
        entry = next((d for d in status.get("devices", [])
                      if (d["driver"], d["pool"], d["device"]) ==
                      (result["driver"], result["pool"], result["device"])), None)
        if entry is None:
            return False
        conditions = {c["type"]: c for c in entry.get("conditions", [])}
        for kind in result.get("bindingFailureConditions", []):
            found = conditions.get(kind)
            if found is not None and found["status"] == "True":
                raise BindingFailed(
                    f"claim {claim['metadata']['name']} binding failed: "
                    f"reason={found.get('reason', '')}, message={found.get('message', '')!r}")
        if not all(conditions.get(k, {}).get("status") == "True"
                   for k in result["bindingConditions"]):
            return False
    return True


def _rfc3339(seconds: float, micro: bool = False) -> str:
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    return f"{text}.{int(seconds % 1 * 1e6):06d}Z" if micro else f"{text}Z"
