"""Which resource.k8s.io version the driver speaks, from what each release's server lists."""

from __future__ import annotations

from typing import Any

import pytest

from api_versions.resource_versions import (
    KNOWN_VERSIONS,
    api_version,
    newest_first,
    pick_version,
    served_versions,
    version_key,
)
from compat_tests.apiserver import load_model
from compat_tests.apiserver.discovery import group


def test_known_versions_newest_first() -> None:
    assert KNOWN_VERSIONS == ("v1", "v1beta2", "v1beta1")
    assert api_version("v1beta2") == "resource.k8s.io/v1beta2"
    with pytest.raises(ValueError, match="v1alpha3"):
        api_version("v1alpha3")


def test_kubernetes_order_not_pep_440() -> None:
    versions = ["v1alpha1", "v1beta1", "v2", "v1", "v11alpha2", "v1beta2", "v2beta1", "v10",
                "v1.DRAPlugin", "v3beta1", "v12alpha1"]
    assert newest_first(versions) == (
        "v10", "v2", "v1", "v3beta1", "v2beta1", "v1beta2", "v1beta1", "v12alpha1",
        "v11alpha2", "v1alpha1", "v1.DRAPlugin")
    assert version_key("v1") > version_key("v2beta1")  # PEP 440 says the opposite


def document(model: str, runtime: str | None = None) -> dict[str, Any]:
    found = group(load_model(model, runtime))
    assert found is not None, f"{model} with {runtime} serves no resource.k8s.io version"
    return found


@pytest.mark.parametrize(("model", "runtime", "picked"), [
    ("1.32", "resource.k8s.io/v1beta1=true", "v1beta1"),
    ("1.33", "resource.k8s.io/v1beta1=true", "v1beta1"),
    ("1.33", "resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true", "v1beta2"),
    ("1.34", None, "v1"),
    ("1.34", "resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true", "v1"),
    ("1.36", None, "v1"),
    ("1.36", "resource.k8s.io/v1=false,resource.k8s.io/v1beta2=true", "v1beta2"),
    ("1.36", "resource.k8s.io/v1=false,resource.k8s.io/v1beta1=true", "v1beta1"),
    ("1.37", None, "v1"),
])
def test_the_newest_served_version_is_picked(model: str, runtime: str | None,
                                             picked: str) -> None:
    assert pick_version(document(model, runtime)) == picked


def test_a_group_with_only_versions_we_do_not_know() -> None:
    doc = {"kind": "APIGroup", "apiVersion": "v1", "name": "resource.k8s.io",
           "versions": [{"groupVersion": "resource.k8s.io/v1alpha3", "version": "v1alpha3"},
                        {"groupVersion": "resource.k8s.io/v2", "version": "v2"}],
           "preferredVersion": {"groupVersion": "resource.k8s.io/v2", "version": "v2"}}
    assert served_versions(doc) == ("v2", "v1alpha3")
    assert pick_version(doc) is None
    assert pick_version(doc, known=("v2", "v1")) == "v2"


@pytest.mark.parametrize(("doc", "field"), [
    ([], "expected a JSON object"),
    ({"kind": "APIGroupList", "name": "resource.k8s.io", "versions": []}, "kind"),
    ({"kind": "APIGroup", "name": "apps", "versions": []}, "name"),
    ({"kind": "APIGroup", "name": "resource.k8s.io"}, "versions: expected a list"),
    ({"kind": "APIGroup", "name": "resource.k8s.io", "versions": [{"version": ""}]},
     r"versions\[0\].version"),
    ({"kind": "APIGroup", "name": "resource.k8s.io", "versions": ["v1"]},
     r"versions\[0\].version"),
])
def test_malformed_documents_are_refused_naming_the_field(doc: Any, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        pick_version(doc)
