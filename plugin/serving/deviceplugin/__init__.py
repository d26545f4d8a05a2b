"""The device-plugin family: one socket per resource, kept registered with every kubelet.

``server`` runs a resource's lifecycle (serve, register through ``kubelet.sock`` or the
plugin watcher, hold, start over when the kubelet does); ``channels`` decides between the
two registration channels per kubelet.
"""
