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

from compat_tests.fake_dra_plugin import FakeDraPlugin
from compat_tests.kubelet import KubeletEmulator
from compat_tests.kubelet.dra import DraConfig
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


FAST_DRA = {"health_retry_period": 0.2, "wipe_retry_initial": 0.05}
"""DRA timings shortened for tests: health retried every 0.2 s (5 s), wipes from 0.05 s (1 s)."""


@pytest.fixture
async def dra_bench(sockdir: Path, logdir: Path, tmp_path: Path) -> AsyncIterator[Any]:
    """One node of emulated Kubernetes for the DRA fault and feature suites: a fake FPGA
    tree, an API server, a kubelet and the real ``serve`` processes, all stopped after the
    test (``compat_tests.dra_bench.Bench``)."""
    from compat_tests.dra_bench import Bench

    node = Bench(tmp_path, sockdir, logdir)
    try:
        yield node
    finally:
        await node.close()


@pytest.fixture
def plugins_registry(sockdir: Path) -> Path:
    path = sockdir / "plugins_registry"
    path.mkdir()
    return path


@pytest.fixture
async def dra_node(sockdir: Path, plugins_registry: Path) -> AsyncIterator[Any]:
    """``await dra_node("1.34", enabled=True, ...)`` starts a kubelet whose DraConfig takes the
    keywords (or ``config=``); ``await dra_node.plugin(...)`` starts a FakeDraPlugin in its
    plugins_registry. Everything stops at teardown, in reverse order."""
    started: list[Any] = []

    class Node:
        async def __call__(self, model: str, config: DraConfig | None = None,
                           **knobs: Any) -> KubeletEmulator:
            config = config or DraConfig(**{**FAST_DRA, **knobs})
            kubelet = KubeletEmulator(sockdir, model, plugins_registry=plugins_registry,
                                      reconcile_period=0.05, dra=config)
            await kubelet.start()
            started.append(kubelet)
            return kubelet

        async def plugin(self, **options: Any) -> FakeDraPlugin:
            fake = await FakeDraPlugin(plugins_registry, **options).start()
            started.append(fake)
            return fake

    yield Node()
    for thing in reversed(started):
        await thing.stop()


# --- the emulated API server (compat_tests/apiserver) ------------------------------------


@pytest.fixture
async def start_api() -> AsyncIterator[Callable[..., Any]]:
    """``api, client = await start_api("1.33", runtime_config=...)``: a started emulated API
    server and a thin client of it; both are stopped at teardown."""
    from compat_tests.apiserver import ApiServerEmulator
    from compat_tests.apiserver.client import ApiClient

    started: list[tuple[Any, Any]] = []

    async def start(model: str = "1.36", **options: Any) -> tuple[Any, Any]:
        api = await ApiServerEmulator(model, **options).start()
        client = await ApiClient(api.url, api.token, api.ca_file).__aenter__()
        started.append((api, client))
        return api, client

    yield start
    for api, client in reversed(started):
        await client.__aexit__(None, None, None)
        await api.stop()


@pytest.fixture
async def api(start_api: Callable[..., Any]) -> Any:
    """A 1.36 emulated API server serving resource.k8s.io v1, v1beta2 and v1beta1."""
    server, _ = await start_api(
        "1.36", runtime_config="resource.k8s.io/v1beta1=true,resource.k8s.io/v1beta2=true")
    return server


@pytest.fixture
async def client(api: Any) -> AsyncIterator[Any]:
    """A thin client (compat_tests.apiserver.client) of the ``api`` fixture."""
    from compat_tests.apiserver.client import ApiClient

    async with ApiClient(api.url, api.token, api.ca_file) as session:
        yield session


@pytest.fixture
async def stack(sockdir: Path) -> AsyncIterator[Callable[[Any], Any]]:
    """Start emulators and fake plugins through this; all are stopped at teardown."""
    started: list[Any] = []

    async def start(thing: Any) -> Any:
        await thing.start()
        started.append(thing)
        return thing

    yield start
    for thing in reversed(started):
        await thing.stop()
