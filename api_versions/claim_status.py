"""A ResourceClaim's ``status.devices[]`` (KEP-4817) as the driver applies it.

``AllocatedDeviceStatus`` is spelt alike in resource.k8s.io v1, v1beta2 and v1beta1 (k8s.io/api
``resource/{v1,v1beta2,v1beta1}/types.go`` v0.36.2): ``driver``, ``pool``, ``device``, optional
``shareID``, ``conditions`` (``metav1.Condition``), ``data`` (a ``runtime.RawExtension``) and
``networkData`` (not used by this driver). The list is a map keyed by driver, device, pool and
shareID, and "entries are owned by their respective drivers", so the body this module builds
carries only this driver's entries: it is a server-side apply configuration, and the server
keeps every other driver's entries (the field manager is the driver name).

The server's rules (k/k ``pkg/apis/resource/validation/validation.go``
``validateDeviceStatus`` and ``validateRawExtension``; limits from the types.go above), which
:func:`status_apply` checks before anything is sent, so a bad entry is this driver's error and
not a 422 retried forever:

* each entry names a device of ``status.allocation.devices.results`` (driver, pool, device and
  shareID), at most once;
* at most 8 conditions (``AllocatedDeviceStatusMaxConditions``), each as
  ``metav1validation.ValidateConditions`` wants it: a qualified-name type, status ``True``,
  ``False`` or ``Unknown``, a ``lastTransitionTime``, a CamelCase ``reason`` of at most 1024
  characters, a message of at most 32768;
* ``data`` a JSON object of at most 10 KiB (``AllocatedDeviceStatusDataMaxLength``), raw.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from api_versions.resource_versions import api_version, check_known
from value_types.claims import ClaimRef, DeviceCondition, DeviceStatusReport

KIND = "ResourceClaim"
MAX_CONDITIONS = 8
MAX_DATA = 10 * 1024
MAX_REASON = 1024
MAX_MESSAGE = 32768
CONDITION_STATUSES = ("True", "False", "Unknown")
_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
_TYPE = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                   r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def data_bytes(data: Mapping[str, Any]) -> int:
    """The size the server measures: the raw JSON as sent (compact, as the client sends it)."""
    return len(json.dumps(dict(data), separators=(",", ":")).encode())


def condition_object(condition: DeviceCondition) -> dict[str, Any]:
    return {"type": condition.type, "status": condition.status, "reason": condition.reason,
            "message": condition.message, "lastTransitionTime": condition.since}


def device_entry(report: DeviceStatusReport) -> dict[str, Any]:
    """One ``AllocatedDeviceStatus`` object."""
    entry: dict[str, Any] = {"driver": report.driver, "pool": report.pool,
                             "device": report.device}
    if report.share_id:
        entry["shareID"] = report.share_id
    entry["conditions"] = [condition_object(c) for c in report.conditions]
    if report.data:
        entry["data"] = {k: list(v) if isinstance(v, tuple) else v for k, v in report.data}
    return entry


def problems(report: DeviceStatusReport) -> list[str]:
    """What the server would refuse in this entry (empty: nothing)."""
    found = []
    where = f"{report.driver}/{report.pool}/{report.device}"
    if len(report.conditions) > MAX_CONDITIONS:
        found.append(f"{where}: {len(report.conditions)} conditions, at most {MAX_CONDITIONS}")
    types = [c.type for c in report.conditions]
    if len(set(types)) != len(types):
        found.append(f"{where}: a condition type twice")
    for c in report.conditions:
        if not _TYPE.match(c.type) or len(c.type) > 316:
            found.append(f"{where}: condition type {c.type!r} is not a qualified name")
        if c.status not in CONDITION_STATUSES:
            found.append(f"{where}: condition status {c.status!r}")
        if not c.reason or len(c.reason) > MAX_REASON or not _REASON.match(c.reason):
            found.append(f"{where}: condition reason {c.reason!r} is not CamelCase")
        if len(c.message) > MAX_MESSAGE:
            found.append(f"{where}: condition message longer than {MAX_MESSAGE}")
        if not c.since:
            found.append(f"{where}: condition {c.type} has no lastTransitionTime")
    if report.data and data_bytes(device_entry(report)["data"]) > MAX_DATA:
        found.append(f"{where}: data larger than {MAX_DATA} bytes")
    return found


def status_apply(version: str, ref: ClaimRef, reports: Sequence[DeviceStatusReport],
                 allocated: Iterable[tuple[str, str, str, str | None]] | None = None
                 ) -> dict[str, Any]:
    """The apply configuration for the claim's ``status`` subresource in ``version``: this
    driver's entries only. The UID makes it a precondition (a claim deleted and created
    again under the same name is answered 409, never given another claim's devices).

    ``allocated`` (driver, pool, device, shareID of each allocation result), when given, is
    checked too. Raises ValueError naming every problem."""
    check_known(version)
    found = [p for r in reports for p in problems(r)]
    keys = [(r.driver, r.pool, r.device, r.share_id or None) for r in reports]
    if len(set(keys)) != len(keys):
        found.append("a device twice in status.devices")
    if allocated is not None:
        known = {(d, p, n, s or None) for d, p, n, s in allocated}
        found += [f"{d}/{p}/{n}: not a device of the claim's allocation"
                  for d, p, n, _ in (k for k in keys if k not in known)]
    if found:
        raise ValueError(f"status of claim {ref.namespace}/{ref.name}: {'; '.join(found)}")
    return {"apiVersion": api_version(version), "kind": KIND,
            "metadata": {"name": ref.name, "namespace": ref.namespace, "uid": ref.uid},
            "status": {"devices": [device_entry(r) for r in reports]}}
