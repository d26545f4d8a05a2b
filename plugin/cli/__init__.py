"""The command line: ``serve``, ``discover``, ``healthcheck``, ``loader``, and their settings.

``main`` dispatches subcommands; ``config`` builds each subcommand's flags and
``ACCELERATOR_DP_*`` variables and parses them into ``settings`` (the frozen value the daemon
reads), each value checked by ``converters`` and their combination by ``validation``;
``sources`` decides which of flag, variable, ``--config`` file
(``config_file``) and default each comes from; ``discover`` shows what a node would get.
The demo is no command of an install: it runs from the source tree (``make demo``, that is
``python -m compat_tests.demo``), where its code lives.
"""
