"""The ``serve`` process: discovery feeds resources, each resource keeps a server registered.

Owns the few node-wide loops (device monitor, kubelet-directory watcher, safety-net checks,
liveness heartbeat, signals) and one :class:`~plugin.server.ResourceServer` per resource name.
Resources appear and disappear with the devices (per-AFU mode); in single mode there is
always exactly one, even with zero devices, so the kubelet sees a count of 0 rather than a
plugin that never registered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from api_versions.negotiate import adapters
from plugin import metrics
from plugin.backends.base import Backend
from plugin.config import Settings
from plugin.dirwatch import Change, DirectoryWatcher
from plugin.feed import DeviceFeed
from plugin.model import DeviceSet
from plugin.monitor import DeviceMonitor, TriggerSource
from plugin.resources import group_by_resource, socket_name_for
from plugin.server import ResourceServer, Timing

log = logging.getLogger(__name__)


@dataclass
class _Resource:
    feed: DeviceFeed
    server: ResourceServer
    task: asyncio.Task[None]


@dataclass
class Daemon:
    settings: Settings
    backend: Backend
    triggers: Sequence[TriggerSource] = ()
    timing: Timing = field(default_factory=Timing)
    resources: dict[str, _Resource] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._stop = asyncio.Event()
        self._stopping: set[asyncio.Task[None]] = set()
        self.candidates = adapters(self.settings.api_versions)

    @property
    def directory(self) -> Path:
        return self.settings.device_plugin_dir

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> int:
        """Serve until SIGTERM/SIGINT or :meth:`stop`; return the process exit code."""
        self._install_signal_handlers()
        self._enable_metrics()
        log.info("starting: backend %s, generations %s, directory %s", self.backend.name,
                 ",".join(a.name for a in self.candidates), self.directory)
        monitor = DeviceMonitor(self.backend, self.settings.rescan_interval, self.triggers,
                                health_interval=self.settings.health_interval,
                                stall_timeout=self.settings.scan_stall_timeout)
        loops: list[Callable[[], object]] = [
            lambda: monitor.run(self._publish),
            self._watch_kubelet_dir,
            self._safety_net,
        ]
        if self.settings.heartbeat_file is not None:
            loops.append(self._heartbeat)
        tasks = [asyncio.create_task(loop()) for loop in loops]  # type: ignore[arg-type]
        try:
            await self._stop.wait()
        finally:
            log.info("stopping")
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for name in list(self.resources):
                self._withdraw(name)
            await self._drain()
        return 0

    async def _publish(self, node: DeviceSet) -> None:
        groups = group_by_resource(
            node, self.settings.resource_mode, self.settings.resource_name,
            self.settings.resource_prefix,
        )
        for name, devices in groups.items():
            metrics.devices(name, devices)
            resource = self.resources.get(name)
            if resource is None:
                self._adopt(name, devices)
            else:
                await resource.feed.publish(devices)
        for name in [n for n in self.resources if n not in groups]:
            log.info("%s: no devices left; withdrawing the resource", name)
            metrics.devices(name, DeviceSet.of(()))
            await self._retire(name)

    def _adopt(self, name: str, devices: DeviceSet) -> None:
        feed = DeviceFeed(devices)
        server = ResourceServer(
            resource_name=name,
            directory=self.directory,
            socket_name=socket_name_for(name, self.settings.socket_name,
                                        self.settings.resource_mode),
            feed=feed,
            candidates=self.candidates,
            policy=self.settings.retry,
            timing=self.timing,
        )
        task = asyncio.create_task(server.run(), name=f"resource {name}")
        self.resources[name] = _Resource(feed, server, task)
        log.info("%s: serving %d devices on %s", name, len(devices), server.socket_path)

    def _withdraw(self, name: str) -> None:
        """Stop serving ``name``; its server finishes in the background (see ``_drain``)."""
        resource = self.resources.pop(name)
        resource.server.stop()
        self._stopping.add(resource.task)
        resource.task.add_done_callback(self._stopping.discard)
        # Closing the feed ends the ListAndWatch streams, so the server can stop at once.
        self._stopping.add(asyncio.create_task(resource.feed.close()))

    async def _retire(self, name: str) -> None:
        self._withdraw(name)
        await self._drain()

    async def _drain(self) -> None:
        """Wait for withdrawn servers to stop, without swallowing our own cancellation."""
        while self._stopping:
            done, _ = await asyncio.wait(set(self._stopping))
            for task in done:
                self._stopping.discard(task)
                if not task.cancelled() and task.exception() is not None:
                    log.error("a resource server failed while stopping",
                              exc_info=task.exception())

    async def _watch_kubelet_dir(self) -> None:
        """Forward every change in the device-plugin directory to the resource servers."""
        watcher = DirectoryWatcher()
        try:
            while True:
                self.directory.mkdir(parents=True, exist_ok=True)
                watcher.watch(self.directory)
                async for event in watcher.events():
                    for resource in list(self.resources.values()):
                        resource.server.on_dir_event(event)
                    if event.change is Change.DIRECTORY_GONE:
                        break
                else:
                    # inotify unavailable: the safety net does all the work.
                    await self._stop.wait()
        finally:
            watcher.close()

    async def _safety_net(self) -> None:
        """Catch what inotify missed (overflow, unusual filesystems), at a slow pace."""
        while True:
            await asyncio.sleep(self.settings.kubelet_check_interval)
            for resource in list(self.resources.values()):
                resource.server.check()

    async def _heartbeat(self) -> None:
        """Touch the heartbeat file only after every live socket answered a real gRPC call."""
        path = self.settings.heartbeat_file
        assert path is not None
        while True:
            results = [await r.server.self_check() for r in list(self.resources.values())]
            if all(results):
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(f"{time.time():.3f}\n")
                except OSError as exc:
                    log.warning("cannot write heartbeat %s: %s", path, exc)
            await asyncio.sleep(self.settings.heartbeat_interval)

    def _enable_metrics(self) -> None:
        """Metrics are a convenience: a port already taken must not stop device serving."""
        if self.settings.metrics_port is None:
            return
        try:
            metrics.enable(self.settings.metrics_address, self.settings.metrics_port)
        except OSError as exc:
            log.error("metrics disabled: cannot listen on %s:%d: %s",
                      self.settings.metrics_address, self.settings.metrics_port, exc)

    def _install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signum, self._on_signal, signum)

    def _on_signal(self, signum: int) -> None:
        log.info("received %s", signal.Signals(signum).name)
        self.stop()


def heartbeat_fresh(path: Path, max_age: float) -> tuple[bool, str]:
    """For ``healthcheck``: is the heartbeat recent enough, and a one-line reason."""
    try:
        age = time.time() - path.stat().st_mtime
    except OSError as exc:
        return False, f"no heartbeat at {path}: {exc.strerror}"
    if age > max_age:
        return False, f"heartbeat {path} is {age:.0f}s old (limit {max_age:.0f}s)"
    return True, f"heartbeat {age:.1f}s old"
