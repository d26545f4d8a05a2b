"""The command line: ``serve``, ``discover``, ``demo``, ``healthcheck``, and their settings.

``main`` dispatches subcommands; ``config`` turns flags and ``ACCELERATOR_DP_*`` variables into
validated settings, ``sources`` decides which of flag, variable, ``--config`` file
(``config_file``) and default each comes from; ``demo`` runs a simulated node; ``discover``
shows what a node would get.
"""
