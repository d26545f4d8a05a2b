"""k8s-accelerator-devplugin: devices flow one way, from the node to whichever API serves them.

``discovery`` reads the node, ``model`` holds what it found, ``serving`` hands it to the
kubelet (as a device plugin today, as a DRA driver next), ``process`` runs it all as a
daemon, and ``cli`` is the command line in front of it. Wire types live only in
``api_versions``.
"""
