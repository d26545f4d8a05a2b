"""Fixtures shared by the emulator tests and the compatibility matrix.

Everything a test starts (emulated kubelets, plugin processes) goes through a factory
fixture that stops it at teardown, by PID for processes, even when the test fails.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from compat_tests.kubelet import KubeletEmulator
from compat_tests.plugin_process import PluginProcess


@pytest.fixture
def sockdir() -> Iterator[Path]:
    """A short device-plugin directory: unix socket paths must stay under 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="dp", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def logdir(tmp_path: Path) -> Path:
    """Where plugin logs go (pytest keeps them for a failed test)."""
    return tmp_path


KubeletFactory = Callable[..., Any]


@pytest.fixture
async def kubelet(sockdir: Path) -> AsyncIterator[KubeletFactory]:
    """``await kubelet("1.9", **knobs)`` starts an emulated kubelet on ``sockdir``."""
    started: list[KubeletEmulator] = []

    async def start(model: str = "1.26", **knobs: Any) -> KubeletEmulator:
        emulator = KubeletEmulator(sockdir, model, **knobs)
        await emulator.start()
        started.append(emulator)
        return emulator

    yield start
    for emulator in reversed(started):
        await emulator.stop()


@pytest.fixture
def plugin(sockdir: Path, logdir: Path) -> Iterator[Callable[..., PluginProcess]]:
    """``plugin(nb_units=4, socket_name=..., extra=[...])`` starts a real serve process."""
    started: list[PluginProcess] = []

    def start(**options: Any) -> PluginProcess:
        options.setdefault("name", f"plugin{len(started)}")
        process = PluginProcess(sockdir, logdir, **options).start()
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()
