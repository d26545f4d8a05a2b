"""An emulated Kubernetes API server (resource.k8s.io v1, v1beta2, v1beta1; 1.32 .. 1.37).

For testing a node-local DRA driver without a cluster: publish ResourceSlices, read
ResourceClaims, over HTTP(S) with bearer tokens, against any release's served versions, with
faults on demand. ``validate`` checks an object the way such a server would.
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
