"""Starting and stopping the real ``serve`` process for benchmarks, the way a node would."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path


def serve_command(directory: Path, *flags: str) -> list[str]:
    """The ``serve`` command line on ``directory`` with ``flags``, logging warnings only."""
    return [sys.executable, "-m", "plugin", "serve", "--device-plugin-dir", str(directory),
            "--log-level", "warning", *flags]


def spawn_serve(directory: Path, *flags: str) -> subprocess.Popen[bytes]:
    """``serve`` on ``directory`` with ``flags``, quiet, in this interpreter's environment."""
    return subprocess.Popen(serve_command(directory, *flags),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def spawn_units(directory: Path, count: int, *flags: str) -> subprocess.Popen[bytes]:
    """``serve`` with the units backend: ``count`` devices and no sysfs at all."""
    return spawn_serve(directory, "--backend", "units", "--accel-nbunits", str(count), *flags)


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, as the kubelet would send; SIGKILL only if it does not exit within 10 s."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
