"""Building the package the way `make` and users do: no warnings to wade through."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_building_the_package_prints_no_deprecation_warning(tmp_path: Path) -> None:
    # With build isolation, as `pip install .` and `pip install -e .` build: setuptools once
    # printed a "license as a TOML table is deprecated" box three times per build.
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(tmp_path),
         str(REPO)],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    output = done.stdout + done.stderr
    assert "deprecated" not in output.lower(), output[-3000:]
    assert list(tmp_path.glob("k8s_accelerator_devplugin-*.whl"))
