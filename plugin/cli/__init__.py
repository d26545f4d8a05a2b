"""The command line: ``serve``, ``discover``, ``healthcheck``, ``loader``, and their settings.

``main`` dispatches subcommands; ``config`` turns flags and ``ACCELERATOR_DP_*`` variables into
validated settings, ``sources`` decides which of flag, variable, ``--config`` file
(``config_file``) and default each comes from; ``discover`` shows what a node would get.
The demo is no command of an install: it runs from the source tree (``make demo``, that is
``python -m compat_tests.demo``), where its code lives.
"""
