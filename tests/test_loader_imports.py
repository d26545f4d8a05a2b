"""Settings parse without the serving code, and still offer exactly what serving takes.

The ``loader`` command parses the same flags as ``serve`` (one ``--config`` file serves
both), so the choices of ``serve``-only flags are spelt in :mod:`plugin.cli.settings`
rather than imported from the modules that act on them (one of them imports gRPC). These
checks keep the two spellings one: a value added on one side only fails here.
"""

from __future__ import annotations

import subprocess
import sys

from plugin.cli import settings
from plugin.serving import cdi, runtime_cdi
from plugin.serving.deviceplugin import channels
from plugin.serving.dra import stopping


def test_the_cli_offers_the_values_serving_takes() -> None:
    assert settings.REGISTRATION_MODES == channels.MODES
    assert settings.CDI_STRATEGIES == cdi.STRATEGIES
    assert settings.RUNTIME_CDI_CHOICES == runtime_cdi.CHOICES
    assert settings.DEFAULT_STOP_TIMEOUT == stopping.DEFAULT_STOP_TIMEOUT


def test_parsing_loader_settings_loads_no_serving_code() -> None:
    code = ("import sys\n"
            "from plugin.cli.config import parse\n"
            "parse(['loader', '--loader-socket', '/run/l/l.sock'])\n"
            "print('\\n'.join(sorted(sys.modules)))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60)
    modules = done.stdout.split()
    assert "plugin.cli.settings" in modules
    assert [m for m in modules if m.split(".")[0] in ("grpc", "google", "api_versions")
            or m.startswith(("plugin.serving", "importlib.metadata"))] == []


def test_version_still_answers() -> None:
    done = subprocess.run([sys.executable, "-m", "plugin", "--version"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("accelerator-device-plugin ")
