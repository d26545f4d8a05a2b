"""``python -m plugin`` is the same as ``accelerator-device-plugin``."""

from plugin.cli.main import main

raise SystemExit(main())
