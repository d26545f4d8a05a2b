"""The process: what runs on the node and keeps running.

The daemon decides what is served on this node and owns the node-wide loops; signals,
supervision (a loop that fails is logged and restarted), shared ticks for slow loops, the
directory watcher, logging and metrics are the pieces every part of it relies on.
"""
