"""`demo` where its code or the `demo` extra is missing, as on a node install.

The image test proves it on the real runtime venv; here each missing piece is simulated in
a fresh interpreter (a ``None`` entry in ``sys.modules`` makes its import fail as if absent).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _demo_without(module: str, node: str) -> subprocess.CompletedProcess[str]:
    script = (f"import sys; sys.modules[{module!r}] = None; "
              "from plugin.cli.main import main; "
              f"raise SystemExit(main(['demo', '--node', {node!r}]))")
    return subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False)


@pytest.mark.parametrize(("missing", "node"), [
    ("compat_tests", "intel"),
    ("compat_tests.demo", "mixed"),
    ("compat_tests.demo_migrate", "migrate"),
    ("aiohttp", "migrate"),
    ("cryptography", "migrate"),
    ("compat_tests.demo_program", "program"),
    ("celpy", "program"),
])
def test_missing_demo_code_or_extra_exits_2_saying_how_to_get_it(missing, node):
    done = _demo_without(missing, node)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("accelerator-device-plugin: error: the demo is not part of this")
    assert f"'{missing.split('.')[0]}'" in line
    assert "make demo" in line and "pip install '.[demo]'" in line
    assert done.stdout == ""


def test_a_missing_runtime_module_is_not_mistaken_for_a_missing_demo():
    done = _demo_without("plugin.process.daemon", "intel")
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "plugin.process.daemon" in done.stderr
    assert "not part of this install" not in done.stderr
