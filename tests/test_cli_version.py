"""``--version``: the one version of the installed package, as an operator asks for it."""

from __future__ import annotations

import subprocess
import sys

from plugin.version import VERSION


def test_version_prints_the_package_version_and_exits_0() -> None:
    result = subprocess.run([sys.executable, "-m", "plugin", "--version"], capture_output=True,
                            text=True, env={"PATH": "/usr/bin:/bin"}, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"accelerator-device-plugin {VERSION}\n"
    assert VERSION != "0+unknown", "the tests run an installed package, which has metadata"
