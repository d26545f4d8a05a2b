"""The real ``accelerator-device-plugin serve`` process, started and watched from a test.

The matrix must exercise the shipped process (flags, signals, its own event loop), not an
in-process object, so this runs ``python -m plugin serve`` with the test's interpreter (the
project's virtualenv) and reads its JSON log lines from a file rather than a pipe, which
could fill up and stall the plugin.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FAST_RETRIES = ("--retry-max-backoff", "0.2", "--kubelet-check-interval", "1")

LogEntry = dict[str, Any]


class PluginProcess:
    """One ``serve`` process on ``directory``; its log goes to ``<log_dir>/<name>.log``."""

    def __init__(
        self,
        directory: Path,
        log_dir: Path,
        *,
        nb_units: int = 4,
        socket_name: str | None = None,
        extra: Sequence[str] = (),
        name: str = "plugin",
        fast_retries: bool = True,
        source: Path | None = None,
        command: Sequence[str] = (sys.executable, "-m", "plugin"),
        cwd: Path | None = None,
    ) -> None:
        self.directory = directory
        self.source = source
        """Another release's source tree (``compat_tests/previous_release.py``) whose
        ``plugin`` package runs instead of this one, or None: this tree's."""
        self.cwd = source or cwd
        """Where it runs: the other release's tree, else ``cwd``, else the test's own."""
        self.log_path = log_dir / f"{name}.log"
        self.socket_name = socket_name or "accelerator.sock"
        self.args = [
            *command, "serve",
            "--backend", "units", "--accel-nbunits", str(nb_units),
            "--device-plugin-dir", str(directory), "--socket-name", self.socket_name,
            "--log-format", "json", *(FAST_RETRIES if fast_retries else ()), *extra,
        ]
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def socket_path(self) -> Path:
        return self.directory / self.socket_name

    @property
    def pid(self) -> int:
        assert self._process is not None, "plugin not started"
        return self._process.pid

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self._process is None else self._process.poll()

    def start(self) -> PluginProcess:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if self.source is not None:  # ``-m`` puts the working directory first on sys.path
            env["PYTHONPATH"] = os.pathsep.join(
                [str(self.source), *filter(None, [os.environ.get("PYTHONPATH")])])
        with open(self.log_path, "ab") as out:
            self._process = subprocess.Popen(
                self.args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, cwd=self.cwd,
            )
        log.info("started plugin pid %d: %s", self._process.pid, " ".join(self.args[1:]))
        return self

    def text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def entries(self) -> list[LogEntry]:
        """The JSON log lines so far; other lines (tracebacks) become ``{"raw": line}``."""
        entries = []
        for line in self.text().splitlines():
            try:
                entries.append(json.loads(line))
            except ValueError:
                entries.append({"raw": line})
        return entries

    async def wait_for_log(
        self, match: Callable[[LogEntry], bool], timeout: float = 10.0, what: str = "log line"
    ) -> LogEntry:
        """Poll the log until an entry matches; fail with the log if the plugin dies."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            for entry in self.entries():
                if match(entry):
                    return entry
            if not self.alive:
                raise AssertionError(f"plugin exited ({self.returncode}) before {what}:\n"
                                     f"{self.text()}")
            if loop.time() > deadline:
                raise TimeoutError(f"no {what} within {timeout} s; plugin log:\n{self.text()}")
            await asyncio.sleep(0.1)

    async def terminate(self, timeout: float = 10.0) -> int:
        """SIGTERM and wait for the exit code (the process is killed if it hangs)."""
        assert self._process is not None
        self._process.send_signal(signal.SIGTERM)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._process.poll() is None:
            if loop.time() > deadline:
                self.kill()
                raise TimeoutError(f"plugin ignored SIGTERM for {timeout} s:\n{self.text()}")
            await asyncio.sleep(0.05)
        return self._process.returncode

    def kill(self) -> None:
        """Teardown: kill this process by its PID if it is still running."""
        if self._process is None or self._process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=5)


def run_at_start_up(source: str, directory: Path, monkeypatch: Any) -> None:
    """Make every ``serve`` started from now on in this test run ``source`` first.

    ``source`` becomes a ``sitecustomize`` module on ``PYTHONPATH``, which Python imports at
    start-up: how the fault tests put a node's condition (a refused socket, a hanging read,
    an exhausted watch limit) in front of the real process without touching its code.
    """
    directory.mkdir()
    (directory / "sitecustomize.py").write_text(source)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(directory), *filter(None, [os.environ.get("PYTHONPATH")])]))
