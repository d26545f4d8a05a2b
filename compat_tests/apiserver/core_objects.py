"""core/v1 Namespaces and ConfigMaps, as far as a driver reads them: ``get``.

A node-local FPGA driver that guards functions by namespace reads the claim's Namespace (its
grant labels, ``functions.accelerator.b-com.com/<class>=true``) and the function catalogue, a
ConfigMap beside the DaemonSet. The emulator serves ``GET /api/v1/namespaces/<name>`` and
``GET /api/v1/namespaces/<ns>/configmaps[/<name>]`` (a list by equality label selector);
tests write them in-process (what ``kubectl
label namespace`` and ``kubectl apply`` would), each write checked against the 1.36 strict
schema of its kind that the ``kubernetes-validate`` test dependency ships, and the labels
against apimachinery's ``ValidateLabels`` (qualified keys, values of at most 63 characters):
an object a real server would refuse is refused here too (ValueError naming the field).

Every namespace the emulator knows (``ApiServerEmulator.namespaces``, added by
``create_namespace`` or by creating a claim in it) has a Namespace, labelled
``kubernetes.io/metadata.name`` as the API server labels every Namespace. Not modelled: the
other verbs, watches, lists, ``resourceVersion`` conditions, Namespace deletion and its
finalizers.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Mapping
from typing import Any

from compat_tests.apiserver import errors, fielderrors, strategy, strict_schemas
from compat_tests.apiserver.resources import ResourceInfo

Obj = dict[str, Any]
NAMESPACES = ResourceInfo("namespaces", "namespace", "Namespace", False, "",
                          ("metadata.name",), short_names=("ns",))
CONFIGMAPS = ResourceInfo("configmaps", "configmap", "ConfigMap", True, "",
                          ("metadata.name", "metadata.namespace"), short_names=("cm",))
NAME_LABEL = "kubernetes.io/metadata.name"


class CoreObjects:
    """The Namespaces and ConfigMaps of one emulator."""

    def __init__(self, namespaces: set[str]) -> None:
        self.namespaces = namespaces
        self._labels: dict[str, dict[str, str]] = {}
        self._uids: dict[str, str] = {}
        self._config_maps: dict[tuple[str, str], Obj] = {}
        self._created = strategy.now()

    # -- reads (the HTTP API) -----------------------------------------------------------

    def namespace(self, name: str) -> Obj:
        if name not in self.namespaces:
            raise errors.not_found("namespaces", "", name)
        return self._namespace(name, self._labels.get(name, {}))

    def config_map(self, namespace: str, name: str) -> Obj:
        found = self._config_maps.get((namespace, name))
        if found is None:
            raise errors.not_found("configmaps", "", name)
        return copy.deepcopy(found)

    def config_maps(self, namespace: str, label_selector: str) -> Obj:
        """A ``ConfigMapList`` of ``namespace`` matching ``label_selector`` (equality terms,
        ``k=v,k2=v2``, as a driver finds a ConfigMap by label)."""
        wanted = {}
        for term in filter(None, label_selector.split(",")):
            key, equals, value = term.partition("=")
            if not equals or not key:
                raise errors.bad_request(f"unable to parse requirement: {term!r}: only "
                                         "equality terms are emulated")
            wanted[key.strip()] = value.lstrip("=").strip()
        items = [copy.deepcopy(o) for (ns, _), o in sorted(self._config_maps.items())
                 if ns == namespace and all(o["metadata"].get("labels", {}).get(k) == v
                                            for k, v in wanted.items())]
        for item in items:
            item.pop("apiVersion")
            item.pop("kind")
        return {"apiVersion": "v1", "kind": "ConfigMapList", "metadata": {"resourceVersion": "1"},
                "items": items}

    # -- writes (tests) -------------------------------------------------------------------

    def label_namespace(self, name: str, key: str, value: str | None) -> Obj:
        """What ``kubectl label namespace NAME KEY=VALUE --overwrite`` (``KEY-`` for None)
        leaves: the Namespace with that label set or removed."""
        labels = dict(self._labels.get(name, {}))
        if value is None:
            labels.pop(key, None)
        else:
            labels[key] = value
        obj = self._namespace(name, labels)
        problems = [*strict_schemas.schema_errors("namespace-v1.json", obj), *(
            f"metadata.labels: {m}" for k, v in labels.items()
            for m in fielderrors.label_key(k) + fielderrors.label_value(v))]
        if problems:
            raise ValueError(f"Namespace {name}: {problems[0]}")
        self.namespaces.add(name)
        self._labels[name] = labels
        return obj

    def put_config_map(self, namespace: str, name: str, data: Mapping[str, str],
                       labels: Mapping[str, str] | None = None) -> Obj:
        """Create or replace a ConfigMap (what ``kubectl apply`` leaves)."""
        obj: Obj = {"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": name, "namespace": namespace,
                                 "uid": str(uuid.uuid4()), "creationTimestamp": strategy.now(),
                                 **({"labels": dict(labels)} if labels else {})},
                    "data": dict(data)}
        problems = strict_schemas.schema_errors("configmap-v1.json", obj)
        if problems:
            raise ValueError(f"ConfigMap {namespace}/{name}: {problems[0]}")
        if namespace not in self.namespaces:
            raise ValueError(f"ConfigMap {namespace}/{name}: namespace {namespace} not found")
        self._config_maps[(namespace, name)] = obj
        return copy.deepcopy(obj)

    def delete_config_map(self, namespace: str, name: str) -> None:
        self._config_maps.pop((namespace, name), None)

    def _namespace(self, name: str, labels: Mapping[str, str]) -> Obj:
        uid = self._uids.setdefault(name, str(uuid.uuid4()))
        return {"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": name, "uid": uid, "creationTimestamp": self._created,
                             "labels": {NAME_LABEL: name, **labels}},
                "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}
