"""How ``openapi/1.37/`` is made from ``openapi/1.36/``, so the stored 1.37 schemas can be checked.

The 1.36 files are the OpenAPI v3 documents a 1.36.2 kube-apiserver serves. No 1.37 document
was at hand to copy the same way (kubernetes/kubernetes ``api/openapi-spec/v3`` at a v1.37 tag;
the copies found were untagged master commits after 1.37). What was at hand is k8s.io/api
(kubernetes/api) at the tags ``v0.36.2`` and ``v0.37.0-beta.0`` (the newest 1.37 tag there,
2026-07-21; kubernetes commit
1056cbb4511a20ae5e4d0173813cd3403c6d836a), the Go types the OpenAPI documents are generated
from. Their difference in ``resource/{v1,v1beta1,v1beta2}`` is, for these documents:

* ``resource/v1``: ``DeviceTaintRule``, ``DeviceTaintRuleList``, ``DeviceTaintRuleSpec``,
  ``DeviceTaintRuleStatus``, ``DeviceTaintSelector`` are new (``register.go`` registers the
  kind; ``+k8s:prerelease-lifecycle-gen:introduced=1.37``), with the same json fields and the
  same documentation (``types_swagger_doc_generated.go`` compared) as v1beta2's in 1.36, so
  they and their REST paths are v1beta2's with the version renamed;
* no json field of any other struct is added, removed or retyped in v1, v1beta1 or v1beta2
  (every ``json:"..."`` tag compared); ``metav1.TypeMeta`` and inlined structs changed from
  ``json:",inline"`` to ``json:""``, which encodes the same;
* three descriptions were reworded (``DeviceSelector``'s CEL ``expression``,
  ``CapacityRequestPolicyRange``, ``DeviceClassSpec.extendedResourceName``); they keep their
  1.36 wording here, which no decoder reads.

So the 1.37 documents are the 1.36 ones plus the v1 DeviceTaintRule definitions and paths,
which is what :func:`derive` builds and ``tests`` compare with the stored files.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent / "openapi"
FILES = ("resource.k8s.io_discovery.json", "resource.k8s.io_v1.json",
         "resource.k8s.io_v1beta1.json", "resource.k8s.io_v1beta2.json")
TAINT_RULE_TYPES = ("DeviceTaintRule", "DeviceTaintRuleList", "DeviceTaintRuleSpec",
                    "DeviceTaintRuleStatus", "DeviceTaintSelector")
"""The kinds and structs resource.k8s.io/v1 gains in 1.37 (taken from v1beta2)."""


def _renamed(value: Any) -> Any:
    """``value`` with every ``v1beta2`` spelling (refs, paths, operation IDs, tags, GVKs)
    turned into ``v1``'s."""
    text = json.dumps(value, ensure_ascii=False)
    text = text.replace("v1beta2", "v1").replace("V1beta2", "V1")
    return json.loads(text)


def derive(source: Path = HERE / "1.36") -> dict[str, dict[str, Any]]:
    """The 1.37 documents, file name -> document, from the 1.36 ones in ``source``."""
    documents = {name: json.loads((source / name).read_text()) for name in FILES}
    v1 = copy.deepcopy(documents["resource.k8s.io_v1.json"])
    beta2 = documents["resource.k8s.io_v1beta2.json"]
    schemas = v1["components"]["schemas"]
    for name in TAINT_RULE_TYPES:
        schemas[f"io.k8s.api.resource.v1.{name}"] = _renamed(
            beta2["components"]["schemas"][f"io.k8s.api.resource.v1beta2.{name}"])
    for path, item in beta2["paths"].items():
        if "devicetaintrules" in path:
            v1["paths"][path.replace("/v1beta2/", "/v1/")] = _renamed(item)
    missing = sorted({ref.rsplit("/", 1)[-1] for ref in _refs(v1)} - set(schemas))
    if missing:
        raise ValueError(f"the derived v1 document refers to undefined schemas: {missing}")
    documents["resource.k8s.io_v1.json"] = v1
    return documents


def _refs(value: Any) -> list[str]:
    if isinstance(value, dict):
        found = [str(value["$ref"])] if "$ref" in value else []
        return found + [r for item in value.values() for r in _refs(item)]
    if isinstance(value, list):
        return [r for item in value for r in _refs(item)]
    return []


def dumps(document: dict[str, Any]) -> str:
    """A document as the stored files spell it (the 1.36 ones included)."""
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write(target: Path = HERE / "1.37") -> None:
    """Write the derived 1.37 documents (run once; the files are committed)."""
    target.mkdir(parents=True, exist_ok=True)
    for name, document in derive().items():
        (target / name).write_text(dumps(document))


if __name__ == "__main__":
    write()
