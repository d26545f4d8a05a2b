"""Loading in a process of its own: the only privileged part of a node that programs FPGAs.

The driver parses tenants' configuration, talks to the API server and serves gRPC; it must
not hold the host's devices. The loader holds them and does nothing else: it answers one
narrow request per connection on a unix socket only the driver can open (:mod:`.protocol`,
:mod:`.server`), and the driver reaches it through stand-in loaders (:mod:`.client`).
"""
