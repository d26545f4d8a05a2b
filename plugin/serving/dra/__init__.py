"""Dynamic Resource Allocation: the same devices through the kubelet's DRA service.

The DRA driver goes here: its registration with the plugin watcher (type ``DRAPlugin``), the
slice reconciler that makes the API server's ResourceSlices agree with the model, claim
preparation with its own checkpoint, and the health stream. Its wire types (the kubelet's DRA
gRPC generations and the resource.k8s.io object shapes) go in ``api_versions``, like every
other wire type.
"""
