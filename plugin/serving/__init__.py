"""Serving: handing the model's devices to the node's kubelet, one family per kubelet API.

``deviceplugin`` is the device-plugin family (one server per resource, registered through
``kubelet.sock`` or the plugin watcher, every wire generation). ``dra`` is where the Dynamic
Resource Allocation driver goes (one DRA service per driver, ResourceSlices in the API server,
claims prepared from a checkpoint). What both families need sits beside them: CDI specs, the
socket claim that keeps two processes off one socket path, and per-socket call routing.
"""
