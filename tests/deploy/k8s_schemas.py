"""Kubernetes JSON schemas of many versions, from the ``kubernetes-validate`` package.

One release of that package ships the schemas of about a dozen Kubernetes versions: the
installed one (a test dependency) covers 1.25 and later; the schemas of 1.11 to 1.24 come from
its 1.24.1 release, fetched once with ``pip download`` (the same registry every install uses)
and cached, because two releases of one package cannot be installed side by side. Every check
uses the ``-strict`` schemas, which reject unknown fields the way a recent API server with
field validation does (and the way an old one silently drops them).

resource.k8s.io objects whose schema a set lacks fall back to the emulated API server of
compat_tests/apiserver (the OpenAPI v3 schemas a 1.36 server serves, narrowed to what the
release being checked knows, plus the server's validation rules), for the releases it models.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import monitoring_schemas
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT4

from compat_tests.apiserver import models, pipeline

OLD_RELEASE = "1.24.1"
OLD_VERSIONS = [f"1.{minor}" for minor in range(11, 25)]
KINDS = ("daemonset-apps-v1", "pod-v1", "serviceaccount-v1", "configmap-v1", "service-v1",
         "clusterrole-rbac-v1", "clusterrolebinding-rbac-v1")
"""The kinds the cache keeps of 1.11..1.24: those the manifests and the chart render there."""


def installed_versions() -> list[str]:
    """The minor versions the installed package ships, e.g. ``["1.25", ..., "1.37"]``."""
    root = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    pattern = re.compile(r"^v(\d+\.\d+)\.0-local-strict$")
    found = {m[1] for p in root.iterdir() if (m := pattern.match(p.name))}
    return sorted(found, key=lambda v: tuple(int(x) for x in v.split(".")))


def installed_dir(version: str) -> Path:
    root = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    return root / f"v{version}.0-local-strict"


def cache_root() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    kinds = hashlib.sha256(" ".join(KINDS).encode()).hexdigest()[:8]
    return base / "k8s-accelerator-devplugin" / f"kubernetes-validate-{OLD_RELEASE}-{kinds}"


def fetch_old_schemas() -> Path:
    """Schemas of 1.11..1.24 (strict), unpacked once under the user's cache directory.

    Test processes running at once (``pytest -n``, two checkouts) share that directory: the
    first one to get the lock fetches, the others wait for it and read what it unpacked,
    never a file another one is still writing."""
    root = cache_root()
    marker = root / ".complete"
    wanted = " ".join((OLD_RELEASE, *KINDS)) + "\n"
    if marker.exists() and marker.read_text() == wanted:
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (marker.exists() and marker.read_text() == wanted):
            _fetch_old_schemas(root)
            marker.write_text(wanted)
    return root


def _fetch_old_schemas(root: Path) -> None:
    with tempfile.TemporaryDirectory() as download:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", download,
             f"kubernetes-validate=={OLD_RELEASE}"],
            check=True, capture_output=True, text=True, timeout=180,
        )
        (archive,) = Path(download).glob("kubernetes*validate-*")
        for name, read in _members(archive):
            parts = Path(name).parts
            if "kubernetes-json-schema" not in parts:
                continue
            rest = parts[parts.index("kubernetes-json-schema") + 1:]
            if len(rest) != 2 or rest[0] not in {f"v{v}.0-local-strict" for v in OLD_VERSIONS}:
                continue
            if rest[1] != "_definitions.json" and rest[1].removesuffix(".json") not in KINDS:
                continue
            target = root / rest[0] / rest[1]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(read())


def _members(archive: Path) -> list[tuple[str, Callable[[], bytes]]]:
    """(name, reader) of every file in an sdist (tar.gz) or a wheel (zip)."""
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as wheel:
            return [(n, functools.partial(wheel.read, n)) for n in wheel.namelist()]
    contents = []
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            if member.isfile():
                source = tar.extractfile(member)
                assert source is not None
                contents.append((member.name, functools.partial(lambda b: b, source.read())))
    return contents


@dataclass(frozen=True)
class SchemaSet:
    version: str
    directory: Path

    @property
    def old_format(self) -> bool:
        return not (self.directory / "_definitions.json").read_text()[:200].count("$defs")


def schema_file_name(obj: dict[str, Any]) -> str:
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", obj["apiVersion"])
    return f"{obj['kind'].lower()}-{group_version}.json"


@cache
def _load(path: Path) -> Any:
    return json.loads(path.read_text())


def validate(obj: dict[str, Any], schemas: SchemaSet) -> list[str]:
    """Every schema violation of ``obj`` (an empty list when it is valid)."""
    schema_path = schemas.directory / schema_file_name(obj)
    if not schema_path.exists():
        return [f"no schema {schema_path.name} in Kubernetes {schemas.version}"]
    schema = _load(schema_path)
    definitions = _load(schemas.directory / "_definitions.json")
    if schemas.old_format:
        registry: Registry = Registry().with_resource(
            "_definitions.json", Resource.from_contents(definitions, default_specification=DRAFT4)
        )
        validator: Any = jsonschema.Draft4Validator(schema, registry=registry)
    else:
        registry = Resource.from_contents(schema) @ Registry()
        registry = Resource.from_contents(definitions) @ registry
        validator = jsonschema.Draft202012Validator(schema, registry=registry)
    return [
        f"{'/'.join(str(p) for p in error.absolute_path) or '<root>'}: {error.message[:300]}"
        for error in validator.iter_errors(obj)
    ]


RESOURCE_GROUP = "resource.k8s.io"
MONITORING_GROUP = "monitoring.coreos.com"


def validate_or_fall_back(obj: dict[str, Any], schemas: SchemaSet) -> list[str]:
    """``validate``, or for a resource.k8s.io object without a schema in ``schemas``, what the
    emulated API server of that minor would refuse (decoding and validation rules alike).
    prometheus-operator's kinds, which no release has, are checked against its own schemas
    (the same whatever the release)."""
    group = str(obj.get("apiVersion", "")).partition("/")[0]
    if group == MONITORING_GROUP:
        try:
            return monitoring_schemas.validate(obj)
        except monitoring_schemas.Unavailable as exc:
            return [f"cannot check {obj['kind']}: {exc}"]
    errors = validate(obj, schemas)
    if group != RESOURCE_GROUP or not (len(errors) == 1 and errors[0].startswith("no schema ")):
        return errors
    if schemas.version not in models.MODELS:
        return errors
    try:
        problems = pipeline.validate(obj, model=schemas.version)
    except ValueError as exc:  # the release does not have that version at all
        problems = [str(exc)]
    return [f"emulated {schemas.version} API server: {p}" for p in problems]
