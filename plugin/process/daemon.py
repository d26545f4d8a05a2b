"""The ``serve`` process: discovery feeds resources, each resource keeps a server registered.

Owns the few node-wide loops (device monitor, kubelet-directory watcher, safety-net checks,
liveness heartbeat, signals), the HTTP probes (:mod:`plugin.process.probe_server`) and one
:class:`~plugin.serving.deviceplugin.server.ResourceServer` per resource name. Every loop runs
supervised (:mod:`plugin.process.supervise`): one that fails or ends is logged and restarted,
never left dead while the process looks healthy. Resources appear and disappear with the
devices (per-AFU mode); in single mode there is always exactly one, even with zero devices, so
the kubelet sees a count of 0 rather than a plugin that never registered.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from api_versions.negotiate import KUBELET_SOCKET, adapters
from api_versions.retry import RetryPolicy
from plugin.cli.config import Settings
from plugin.cli.settings import dra_state_dir, events_enabled
from plugin.cli.sources import describe
from plugin.discovery.backends.base import Backend
from plugin.discovery.monitor import DeviceMonitor, TriggerSource
from plugin.model.feed import DeviceFeed
from plugin.model.held import held_out
from plugin.model.resources import group_by_resource, socket_name_for
from plugin.process import metrics
from plugin.process.dirwatch import Change, DirectoryWatcher
from plugin.process.dra_side import DraSide, NodeApi
from plugin.process.liveness import Heartbeat, Verdict
from plugin.process.readiness import node_readiness
from plugin.process.signals import Meaning, SignalRouter, name_of
from plugin.process.supervise import MAX_DELAY, supervise
from plugin.process.ticks import sleep_to_tick
from plugin.serving.cdi import CdiPolicy, SpecWriter
from plugin.serving.deviceplugin.server import ResourceServer
from plugin.serving.deviceplugin.timing import Timing
from plugin.version import VERSION
from value_types.devices import DeviceSet

if TYPE_CHECKING:
    from plugin.process.node_events import NodeEvents
    from plugin.process.probe_server import ProbeServer
    from plugin.programming.loaders.base import Loader
    from plugin.programming.quarantine import Quarantine

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
    owns_process: bool = False
    """True for the ``serve`` command: every signal is handled (see :mod:`plugin.process.signals`)
    and, once stopped, ignored until the process has exited. In-process users (tests, the
    demo) only lend their stop signals, and get their own handlers back afterwards."""
    loaders: Mapping[str, Loader] | None = None
    """Replaces the loaders ``--programming`` and its flags choose (in-process tests and
    the demo put stand-ins for the kernel and vendor tools here)."""
    probes: ProbeServer | None = None
    """The probe port, bound before the daemon starts (``--probe-port``); answered from
    :meth:`run` on, closed when it returns."""

    def __post_init__(self) -> None:
        if self.timing.watcher_wait != self.settings.watcher_wait:
            self.timing = replace(self.timing, watcher_wait=self.settings.watcher_wait)
        self._stop = asyncio.Event()
        self._stopping: set[asyncio.Task[None]] = set()
        self.candidates = adapters(self.settings.api_versions)
        self._signals = SignalRouter(self._on_signal)
        self._monitor: DeviceMonitor | None = None
        dra = self.settings.api != "device-plugin"
        # DRA hands devices to containers only through CDI: its specs are always written.
        self._cdi = SpecWriter(self.settings.cdi_spec_dir) if self.settings.cdi or dra else None
        self._last_node: DeviceSet | None = None
        self._counted: set[str] = set()
        """Resource names the device metrics were last set for (a vanished one goes to 0)."""
        self.heartbeat = Heartbeat(self.settings.heartbeat_max_age)
        self.node_events: NodeEvents | None = None
        if events_enabled(self.settings):  # imported only then: the device plugin pays nothing
            from plugin.process.node_events import NodeEvents

            self.node_events = NodeEvents.for_settings(self.settings)
        self.quarantine: Quarantine | None = None
        """Devices a failed load left Unhealthy (see :mod:`plugin.programming.quarantine`);
        imported only with programming on, as the device plugin never loads anything."""
        if dra and self.settings.programming == "on":
            from plugin.programming.quarantine import Quarantine

            self.quarantine = Quarantine(dra_state_dir(self.settings), self._quarantine_changed)
        self._republishing: set[asyncio.Task[None]] = set()
        events = self.node_events
        self.dra_side = DraSide(self.settings, self._cdi, self._stop.is_set,
                                self._withdraw_all, self._publish_again,
                                moved=events.api_moved if events else None,
                                held=events.held if events else None,
                                runtime_warning=events.runtime_without_cdi if events else None,
                                rescan=self._rescan, quarantine=self.quarantine,
                                programmed=events.programmed if events else None,
                                claim_told=events.about_claim if events else None,
                                loaders=self.loaders) \
            if dra and self._cdi is not None else None

    @property
    def directory(self) -> Path:
        return self.settings.device_plugin_dir

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> int:
        """Serve until SIGTERM/SIGINT/SIGQUIT or :meth:`stop`; return the process exit code."""
        self._signals.install(everything=self.owns_process)
        try:
            return await self._serve_until_stopped()
        finally:
            self._signals.release(ignore=self.owns_process)

    async def _serve_until_stopped(self) -> int:
        self._enable_metrics()
        metrics.follow_node_api([api.short_name for api in NodeApi], self._node_api)
        log.info("starting: version %s, backend %s, generations %s, directory %s; %s", VERSION,
                 self.backend.name, ",".join(a.name for a in self.candidates), self.directory,
                 describe(self.settings.origins))
        if self.settings.programming == "on" and self.settings.api == "device-plugin":
            log.warning("--programming on has no effect with --api device-plugin: the device "
                        "plugin serves the functions loaded beforehand (a claim names the "
                        "function to load only through DRA: --api dra or auto)")
        monitor = DeviceMonitor(self.backend, self.settings.rescan_interval, self.triggers,
                                health_interval=self.settings.health_interval,
                                stall_timeout=self.settings.scan_stall_timeout)
        self._monitor = monitor
        if self.node_events is not None:
            self.node_events.start(self._stop)

        async def follow_devices() -> None:
            await monitor.run(self._publish)
            if self.backend.static:  # one snapshot is all a static backend ever has
                await self._stop.wait()

        loops: dict[str, Callable[[], Awaitable[object]]] = {
            "device monitor": follow_devices,
            "kubelet directory watcher": self._watch_kubelet_dir,
            "kubelet safety-net check": self._safety_net,
        }
        if self.settings.heartbeat_file is not None or self.probes is not None:
            loops["liveness heartbeat"] = self._heartbeat
        if self.probes is not None:
            from plugin.process.probe_server import on_loop  # http.server: only when asked

            self.probes.start(self.heartbeat.verdict,
                              on_loop(asyncio.get_running_loop(), self.readiness))
        tasks = [
            asyncio.create_task(supervise(
                name, body, finished=self._stop.is_set, max_delay=MAX_DELAYS.get(name, MAX_DELAY),
            ), name=name)
            for name, body in loops.items()
        ]
        try:
            await self._stop.wait()
        finally:
            log.info("stopping")
            # Servers first: one in the middle of a registration must not see it through
            # while the loops below take their time to end.
            for name in list(self.resources):
                self._withdraw(name)
            if self.dra_side is not None:  # while discovery runs: a load ending is seen
                await self.dra_side.close()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._drain()
            if self.node_events is not None:
                await self.node_events.close()
            if self.probes is not None:
                await asyncio.to_thread(self.probes.close)
        log.info("stopped; sockets removed")
        return 0

    async def _publish(self, found: DeviceSet) -> None:
        node = found if self.quarantine is None else self.quarantine.apply(found)
        if self._stop.is_set():  # no resource adopted anew, but a DRA load ending is seen
            if self.dra_side is not None:
                await self.dra_side.follow(node)
            return
        self._last_node = found
        groups = group_by_resource(
            node, self.settings.resource_mode, self.settings.resource_name,
            self.settings.resource_prefix,
        )
        for name, devices in groups.items():
            metrics.devices(name, devices)
        for name in self._counted - groups.keys():
            metrics.devices(name, DeviceSet.of(()))
        self._counted = set(groups)
        if self.node_events is not None:
            self.node_events.devices(node, groups)  # never waits: queued for its own task
        if self.dra_side is not None:
            await self.dra_side.publish(node, groups)
            if not self.dra_side.device_plugin_allowed:
                return
            groups = {name: held_out(devices, self.dra_side.dra_held)
                      for name, devices in groups.items()}
        for name, devices in groups.items():
            resource = self.resources.get(name)
            if resource is None:
                resource = self._adopt(name, devices)
            self._describe_for_cdi(resource.server, name, devices)
            await resource.feed.publish(devices)
        for name in [n for n in self.resources if n not in groups]:
            log.info("%s: no devices left; withdrawing the resource", name)
            await self._retire(name)

    async def _withdraw_all(self) -> None:
        """Every device-plugin server stopped (the node moves to DRA)."""
        for name in list(self.resources):
            self._withdraw(name)
        await self._drain()

    def _quarantine_changed(self) -> None:
        """A device's failed load was recorded or cleared: every API hears of it now, not
        at the next scan."""
        task = asyncio.get_running_loop().create_task(self._publish_again())
        self._republishing.add(task)
        task.add_done_callback(self._republishing.discard)

    async def _publish_again(self) -> None:
        """The last device set published anew (the node moved back from DRA)."""
        if self._last_node is not None:
            await self._publish(self._last_node)

    def _describe_for_cdi(self, server: ResourceServer, name: str, devices: DeviceSet) -> None:
        """Spec first, names second: a device is named in Allocate only once its spec is on
        disk for the runtime to read. While the spec cannot be written, Allocate answers
        with DeviceSpecs alone, whatever the strategy: a CDI name the runtime cannot
        resolve would fail the container."""
        if self._cdi is None or not self.settings.cdi:
            return
        written = self._cdi.write(name, devices)
        server.cdi = CdiPolicy.of(
            name, devices, self.settings.device_list_strategy) if written else None

    def _adopt(self, name: str, devices: DeviceSet) -> _Resource:
        feed = DeviceFeed(devices)
        server = ResourceServer(
            resource_name=name,
            directory=self.directory,
            socket_name=socket_name_for(name, self.settings.socket_name,
                                        self.settings.resource_mode),
            feed=feed,
            candidates=self.candidates,
            policy=self.settings.retry or RetryPolicy(),
            timing=self.timing,
            registration=self.settings.registration,
            registry_dir=self.settings.plugins_registry_dir,
            gate=self.dra_side.device_plugin_may_serve if self.dra_side is not None else None,
            replicas=self.settings.replicas,
        )
        task = asyncio.create_task(
            supervise(f"server of {name}", server.run, finished=server.stopped),
            name=f"resource {name}")
        self.resources[name] = _Resource(feed, server, task)
        log.info("%s: serving %s on %s", name, count(len(devices), "device"), server.socket_path)
        return self.resources[name]

    def _withdraw(self, name: str) -> None:
        """Stop serving ``name``; its server finishes in the background (see ``_drain``)."""
        if self._cdi is not None and self.dra_side is None:  # the DRA side owns them
            self._cdi.remove(name)
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
                    log.error("a resource server failed while stopping", exc_info=task.exception())

    async def _watch_kubelet_dir(self) -> None:
        """Forward every change in the device-plugin directory to the resource servers.

        Raises when the directory cannot be created or watched (a read-only parent, say);
        the supervisor logs that and calls this again, so the watch is re-armed as soon as
        the directory can be watched. Meanwhile the safety net still notices restarts.
        """
        watcher = DirectoryWatcher()
        try:
            while True:
                self.directory.mkdir(parents=True, exist_ok=True)
                if watcher.available and not watcher.watch(self.directory):
                    raise OSError(f"cannot watch {self.directory}")
                async for event in watcher.events():
                    for resource in list(self.resources.values()):
                        resource.server.on_dir_event(event)
                    if self.dra_side is not None and event.name in (KUBELET_SOCKET, None):
                        self.dra_side.kick()
                    if event.change is Change.DIRECTORY_GONE:
                        break
                else:
                    # inotify unavailable: the safety net does all the work.
                    await self._stop.wait()
                # The directory was removed or replaced: tell the servers, then watch anew.
                for resource in list(self.resources.values()):
                    resource.server.check()
        finally:
            watcher.close()

    async def _safety_net(self) -> None:
        """Catch what inotify missed (overflow, unusual filesystems), at a slow pace."""
        while True:
            await sleep_to_tick(self.settings.kubelet_check_interval)
            for resource in list(self.resources.values()):
                resource.server.check()
            if self.dra_side is not None:
                self.dra_side.kick()

    async def _heartbeat(self) -> None:
        """After every live socket answered a real gRPC call, say so: to /livez (every
        round's outcome) and by touching the heartbeat file (the rounds that passed)."""
        path = self.settings.heartbeat_file
        while True:
            failed = [name for name, resource in list(self.resources.items())
                      if not await resource.server.self_check()]
            if self.dra_side is not None and not await self.dra_side.self_check():
                failed.append(f"DRA driver {self.settings.dra_driver_name}")
            self.heartbeat.record(failed)
            if not failed and path is not None:
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(f"{time.time():.3f}\n")
                except OSError as exc:
                    log.warning("cannot write heartbeat %s: %s", path, exc)
            await sleep_to_tick(self.settings.heartbeat_interval)

    def readiness(self) -> Verdict:
        """``/readyz``: live, and the node served through the API it is served through now
        (see :mod:`plugin.process.readiness`). Runs on the event loop."""
        if self._stop.is_set():
            return Verdict(False, "stopping")
        live = self.heartbeat.verdict()
        if not live.ok:
            return Verdict(False, f"not live: {live.why}")
        servers = {name: r.server.readiness for name, r in self.resources.items()}
        expected = None if self._last_node is None else self._counted
        return node_readiness(expected, servers, self.dra_side)

    def _enable_metrics(self) -> None:
        """Metrics are a convenience: a port already taken must not stop device serving."""
        if self.settings.metrics_port is None:
            return
        try:
            metrics.enable(self.settings.metrics_address, self.settings.metrics_port)
        except OSError as exc:
            log.error("metrics disabled: cannot listen on %s:%d: %s",
                      self.settings.metrics_address, self.settings.metrics_port, exc)

    def _node_api(self) -> str | None:
        """The API the node is served through now; None while ``auto`` has not decided."""
        if self.dra_side is None:
            return NodeApi.DEVICE_PLUGIN.short_name
        choice = self.dra_side.choice
        return None if choice is None else choice.short_name

    def _on_signal(self, signum: int, meaning: Meaning) -> None:
        name = name_of(signum)
        if meaning is Meaning.STOP:
            if self._stop.is_set():
                log.info("received %s; already stopping", name)
                return
            log.info("received %s; stopping", name)
            self.stop()
        elif self._stop.is_set():
            log.info("received %s while stopping; ignored", name)
        elif meaning is Meaning.RELOAD:
            log.info("received %s: rescanning devices and registering again", name)
            self._rescan(name)
            for resource in list(self.resources.values()):
                resource.server.restart(f"{name} received")
        elif meaning is Meaning.STATUS:
            log.info("received %s: rescanning devices; status follows", name)
            self._rescan(name)
            self._log_status()
        else:
            log.warning("received %s; ignored (SIGTERM stops the plugin, SIGHUP re-registers "
                        "it)", name)

    def _rescan(self, reason: str) -> None:
        if self._monitor is not None:
            self._monitor.request_scan(reason)

    def _log_status(self) -> None:
        if not self.resources:
            log.info("status: no resource served")
        for name, resource in self.resources.items():
            devices = resource.feed.current
            healthy = len(devices.healthy_ids())
            server = resource.server
            state = (f"registered through {server.generation}" if server.generation
                     else "not registered")
            log.info("status: %s on %s: %s, %s (%d healthy), %d registrations so far", name,
                     server.socket_path, state, count(len(devices), "device"), healthy,
                     server.registrations)


def count(number: int, noun: str) -> str:
    """``1 device``, ``0 devices``, ``6 devices``."""
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


MAX_DELAYS = {"kubelet directory watcher": 2.0}
"""Loops retried more often than supervise's default: a directory watcher that cannot be
armed is retried at least every 2 s, so it re-arms soon after the directory appears."""


def heartbeat_fresh(path: Path, max_age: float) -> tuple[bool, str]:
    """For ``healthcheck``: is the heartbeat recent enough, and a one-line reason."""
    try:
        age = time.time() - path.stat().st_mtime
    except OSError as exc:
        return False, f"no heartbeat at {path}: {exc.strerror}"
    if age > max_age:
        return False, f"heartbeat {path} is {age:.0f}s old (limit {max_age:.0f}s)"
    return True, f"heartbeat {age:.1f}s old"
