"""The strict JSON schemas of core Kubernetes kinds the emulator also serves (Node, Event).

resource.k8s.io has its own OpenAPI beside this module (``openapi/``); the kinds the driver
only touches at the edge are checked against the per-release strict schemas the test
dependency ``kubernetes-validate`` ships, so an object the driver sends that a real API server
would refuse for its shape is refused here too.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

SCHEMA_RELEASE = "1.36"


@cache
def _validator(schema_file: str, release: str) -> Any:
    import jsonschema
    import kubernetes_validate
    from referencing import Registry, Resource

    directory = (Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
                 / f"v{release}.0-local-strict")
    schema = json.loads((directory / schema_file).read_text())
    definitions = json.loads((directory / "_definitions.json").read_text())
    registry: Registry = Resource.from_contents(schema) @ Registry()
    registry = Resource.from_contents(definitions) @ registry
    return jsonschema.Draft202012Validator(schema, registry=registry)


def schema_errors(schema_file: str, obj: dict[str, Any],
                  release: str = SCHEMA_RELEASE) -> list[str]:
    """What the strict schema ``schema_file`` (e.g. ``node-v1.json``) of ``release`` says
    against ``obj``, one line per problem, naming the field."""
    return [f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message[:300]}"
            for e in _validator(schema_file, release).iter_errors(obj)]
