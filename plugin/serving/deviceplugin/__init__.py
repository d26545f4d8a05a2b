"""The device-plugin family: one socket per resource, kept registered with every kubelet.

``server`` runs a resource's lifecycle (serve, register, hold, start over when the kubelet
does); ``socket`` binds and confirms the socket; ``kubelet_socket`` registers through
``kubelet.sock`` by negotiating a generation; ``watcher_hold`` lets the kubelet's plugin
watcher find and register the socket; ``channels`` decides between the two per kubelet;
``handover`` times a socket's hand-over between two instances; ``timing`` is how patient they
all are. Imports within the package point one way, from ``server`` down, never back.
"""
