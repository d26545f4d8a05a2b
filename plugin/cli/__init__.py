"""The command line: ``serve``, ``discover``, ``demo``, ``healthcheck``, and their settings.

``main`` dispatches subcommands; ``config`` turns flags and ``ACCELERATOR_DP_*`` variables into
validated settings, ``sources`` decides which of flag, variable, ``--config`` file
(``config_file``) and default each comes from; ``discover`` shows what a node would get.
``demo`` runs a simulated node from the source tree's ``compat_tests/`` (its code is in no
wheel: a node install says how to get it).
"""
