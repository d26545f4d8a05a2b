"""The command line: ``serve``, ``discover``, ``demo``, ``healthcheck``, and their settings.

``main`` dispatches subcommands; ``config`` turns flags and ``ACCELERATOR_DP_*`` variables into
validated settings; ``demo`` runs a simulated node; ``discover`` shows what a node would get.
"""
