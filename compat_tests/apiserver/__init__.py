"""An emulated Kubernetes API server (resource.k8s.io v1, v1beta2, v1beta1; releases 1.32 .. 1.38).

For testing a node-local DRA driver without a cluster: it publishes ResourceSlices and reads
ResourceClaims over HTTP(S) with bearer tokens, against the versions a given release serves,
with faults on demand; ``validate`` checks an object the way such a server would.

Deliberate difference from a real server: when a request does not say ``fieldValidation``, the
emulator applies ``Strict`` (a real one applies ``Warn``: drops unknown fields, answers with a
Warning header) so a driver's typo fails loudly; pass ``default_field_validation="Warn"`` for the
real default.

Not modelled (a real API server does these): server-side apply (415) except of a claim's status
(apply.py), managedFields, RBAC beyond denied verbs (faults.py, claim_authz.py), YAML and protobuf
bodies, the aggregated discovery format, resourceclaimtemplates, devicetaintrules and v1alpha3,
admission (ValidatingAdmissionPolicy, NodeRestriction, quota), CEL compilation of selectors (only
their size is checked), nodeAllocatableResourceMappings rules, consistent snapshots for
``continue`` and ``resourceVersionMatch=Exact`` lists (pages come from the current state), priority
and fairness (429 only when injected), garbage collection except of a deleted Node's dependants,
``nodes/status`` writes and the spec rules of a Node update (nodes.py: Nodes are read, listed,
watched, updated and patched, as ``kubectl label`` does), server-chosen watch timeouts, HTTP/2, and
schema differences between releases other than the fields and gates listed in models.py (the
schemas are those of 1.36). Of Namespaces and ConfigMaps, only the reads of core_objects.py.
"""

from compat_tests.apiserver.faults import DEFAULT_USER, Faults, LoggedRequest
from compat_tests.apiserver.models import MODELS, ServerModel, load_model
from compat_tests.apiserver.pipeline import validate
from compat_tests.apiserver.server import ApiServerEmulator

__all__ = [
    "DEFAULT_USER",
    "MODELS",
    "ApiServerEmulator",
    "Faults",
    "LoggedRequest",
    "ServerModel",
    "load_model",
    "validate",
]
