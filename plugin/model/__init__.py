"""The device model: what discovery found, in the one shape every serving family reads.

Frozen devices and device sets, how devices group into resources and what those are named,
the allocation rules every wire generation refuses alike with, and the feed that carries each
resource's latest device set to whoever serves it. Nothing here reads a file or knows a wire.
"""
