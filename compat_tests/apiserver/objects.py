"""Small builders for the objects tests put into the emulator (v1 shapes).

They return plain dicts so a test can change any field before sending it; the emulator's own
helpers (``create_claim``, ``create_allocated_claim``...) run them through the same validation as
an HTTP write, so what a test sets up is something a real server would have accepted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from compat_tests.apiserver.convert import api_version

Obj = dict[str, Any]


DEFAULT_RUNTIME = "containerd://2.1.4"
"""What a node's kubelet reports by default: a runtime that applies CDI (containerd 2.x)."""


def node_info(runtime: str) -> Obj:
    """``status.nodeInfo`` as a kubelet writes it; every field the 1.36 schema requires."""
    return {"machineID": "0" * 32, "systemUUID": "00000000-0000-0000-0000-000000000000",
            "bootID": "00000000-0000-0000-0000-000000000001", "kernelVersion": "6.1.0",
            "osImage": "Debian GNU/Linux 12 (bookworm)", "containerRuntimeVersion": runtime,
            "kubeletVersion": "v1.36.2", "kubeProxyVersion": "", "operatingSystem": "linux",
            "architecture": "amd64"}


def node(name: str, labels: Mapping[str, str] | None = None,
         runtime: str = DEFAULT_RUNTIME) -> Obj:
    """A Node; ``runtime`` is its ``status.nodeInfo.containerRuntimeVersion``."""
    meta: Obj = {"name": name}
    if labels:
        meta["labels"] = dict(labels)
    return {"kind": "Node", "apiVersion": "v1", "metadata": meta, "spec": {},
            "status": {"conditions": [{"type": "Ready", "status": "True"}],
                       "nodeInfo": node_info(runtime)}}


def device_class(name: str, *, driver: str | None = None,
                 extended_resource_name: str | None = None, spec: Obj | None = None) -> Obj:
    """A DeviceClass; ``driver`` adds the usual ``device.driver == "..."`` CEL selector."""
    body: Obj = dict(spec or {})
    if driver is not None:
        body.setdefault("selectors", []).append(
            {"cel": {"expression": f'device.driver == "{driver}"'}})
    if extended_resource_name is not None:
        body["extendedResourceName"] = extended_resource_name
    return {"apiVersion": api_version("v1"), "kind": "DeviceClass", "metadata": {"name": name},
            "spec": body}


def claim(namespace: str, name: str,
          requests: Sequence[tuple[str, str]] | Mapping[str, str] = (("req-0", "fpga"),),
          *, annotations: Mapping[str, str] | None = None) -> Obj:
    """A ResourceClaim with one ``exactly`` request per (request name, device class)."""
    pairs = list(requests.items()) if isinstance(requests, Mapping) else list(requests)
    meta: Obj = {"name": name, "namespace": namespace}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"apiVersion": api_version("v1"), "kind": "ResourceClaim", "metadata": meta,
            "spec": {"devices": {"requests": [
                {"name": request, "exactly": {"deviceClassName": device_class_name}}
                for request, device_class_name in pairs]}}}


def result(request: str, driver: str, pool: str, device: str, **extra: Any) -> Obj:
    """One ``status.allocation.devices.results[]`` entry."""
    return {"request": request, "driver": driver, "pool": pool, "device": device, **extra}


def allocation(results: Iterable[Obj], *, node_name: str | None = None,
               config: Sequence[Obj] = ()) -> Obj:
    """A ``status.allocation``; ``node_name`` adds the node selector a scheduler writes."""
    out: Obj = {"devices": {"results": list(results)}}
    if config:
        out["devices"]["config"] = list(config)
    if node_name is not None:
        out["nodeSelector"] = {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node_name]}]}]}
    return out


def pod_reference(name: str, uid: str) -> Obj:
    """A ``status.reservedFor`` entry for a pod."""
    return {"resource": "pods", "name": name, "uid": uid}


def resource_slice(name: str, *, driver: str, node_name: str, devices: Sequence[Obj] = (),
                   pool: str | None = None, generation: int = 0, slice_count: int = 1) -> Obj:
    """A node-local ResourceSlice (v1 shape) as a driver publishes it."""
    return {"apiVersion": api_version("v1"), "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": driver, "nodeName": node_name,
                     "pool": {"name": pool or node_name, "generation": generation,
                              "resourceSliceCount": slice_count},
                     "devices": list(devices)}}


def device(name: str, attributes: Mapping[str, Any] | None = None,
           capacity: Mapping[str, str] | None = None, taints: Sequence[Obj] = ()) -> Obj:
    """A v1 device; plain attribute values are wrapped (``3`` -> ``{"int": 3}``)."""
    out: Obj = {"name": name}
    if attributes:
        out["attributes"] = {k: v if isinstance(v, dict) else _attribute(v)
                             for k, v in attributes.items()}
    if capacity:
        out["capacity"] = {k: {"value": v} for k, v in capacity.items()}
    if taints:
        out["taints"] = list(taints)
    return out


def _attribute(value: Any) -> Obj:
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    return {"string": str(value)}
