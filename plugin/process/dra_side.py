"""The daemon's DRA side, and with ``--api auto`` the choice of API for this node.

``--api dra`` serves the node through its DRA driver from the first device set on. ``--api
auto`` decides per kubelet instance (a kubelet is known by the ``kubelet.sock`` it creates at
every start; while none runs there is nothing to decide, and the node stays as it is), as the
registration channel is decided:

1. the node's container runtime must apply CDI, through which alone DRA hands devices to
   containers: judged from the Node's ``status.nodeInfo.containerRuntimeVersion`` and
   ``--runtime-cdi`` (:mod:`plugin.serving.runtime_cdi`), before anything else is asked. A
   runtime that does not, or that cannot be told (a Node that cannot be read included: fail
   safe), keeps the device plugin; a new ``containerRuntimeVersion`` (a kubelet started over
   another runtime) is a new decision;
2. the API server must serve a resource.k8s.io version the driver speaks, and a DeviceClass
   must map every resource name of the node (``spec.extendedResourceName``), or pods asking for
   a name would find nothing through DRA;
3. the kubelet must accept the driver: its socket is put in the plugin registry, and the
   kubelet's plugin watcher answers (a kubelet without DRA says ``no handler registered for
   plugin type: DRAPlugin``; one that says nothing within ``--watcher-wait`` counts as no).

DRA when all hold, the device plugin otherwise, unless the Node's label
``accelerator.b-com.com/api`` says otherwise (:mod:`plugin.process.api_label`): read at each
decision and watched, so a label change is a new decision at once, for the same kubelet,
moving the node with the same care as below. ``--api dra`` serves DRA whatever the runtime,
but where it may not apply CDI it says so: a warning, a ``RuntimeWithoutCDI`` Event on the
Node, and a ``RuntimeAppliesCDI`` condition (False, or Unknown where it cannot tell) on every
prepared device in each claim's status. The same resource is never offered both ways
(KEP-5004: a device plugin advertising the name makes the scheduler ignore DRA on the node):
moving to DRA, the device-plugin servers are withdrawn before the first slice is published;
moving back, the slices are deleted and the DRA socket removed before a device-plugin server
registers. So a node upgraded 1.33 -> 1.36 under a running plugin moves to DRA at its first
1.36 kubelet start, and back at a downgrade, with no restart and only the decision (a few
milliseconds where the kubelet answers at once) between the two.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from enum import Enum
from typing import TYPE_CHECKING

from api_versions.negotiate import KUBELET_SOCKET
from plugin.cli.config import Settings
from plugin.cli.settings import dra_state_dir, grants_source
from plugin.model.feed import DeviceFeed
from plugin.model.held import DRA, Held, nothing
from plugin.process.api_label import NO_LABEL, LabelReader, Override, Pin
from plugin.process.supervise import supervise
from plugin.serving.cdi import CdiPolicy, SpecWriter
from plugin.serving.holds import HoldWatch
from plugin.serving.routing import FileIdentity, identity
from plugin.serving.runtime_cdi import CONDITION, Verdict, judge
from value_types.devices import DeviceSet

if TYPE_CHECKING:
    from plugin.programming.loaders.base import Loader
    from plugin.programming.programmer import Told
    from plugin.programming.quarantine import Quarantine
    from plugin.serving.dra.driver import DraDriver
    from plugin.serving.dra.function_audit import ClaimTold
    from plugin.serving.dra.node_labels import NodeLabelWatch

log = logging.getLogger(__name__)

GATE_SLACK = 5.0
"""Beyond --watcher-wait and one --api-request-timeout (the API server calls the decision
makes), how long a device-plugin server waits for the node's decision."""


class NodeApi(Enum):
    DEVICE_PLUGIN = "the device plugin"
    DRA = "DRA"

    @property
    def short_name(self) -> str:
        """As in ``--api`` (and in the ``node_api`` metric)."""
        return "dra" if self is NodeApi.DRA else "device-plugin"


class DraSide:
    """Owns the node feed, the DRA driver and, under ``auto``, the choice between APIs.

    ``withdraw_device_plugin`` stops every device-plugin server (and waits for them);
    ``republish`` hands the last device set to the daemon again, so that the device-plugin
    servers come back after the node moved off DRA.
    """

    def __init__(self, settings: Settings, cdi: SpecWriter, stopping: Callable[[], bool],
                 withdraw_device_plugin: Callable[[], Awaitable[None]],
                 republish: Callable[[], Awaitable[None]],
                 moved: Callable[[str, str, str], None] | None = None,
                 held: Callable[[str], None] | None = None, *,
                 rescan: Callable[[str], None] = lambda reason: None,
                 quarantine: Quarantine | None = None, programmed: Told | None = None,
                 claim_told: ClaimTold | None = None, loaders: Mapping[str, Loader] | None = None,
                 runtime_warning: Callable[[str], None] | None = None) -> None:
        self.settings = settings
        self._runtime_warning = runtime_warning
        """Told (once per runtime version) that ``--api dra`` serves a node whose runtime may
        not apply CDI (a Warning Event)."""
        self._runtime_said: str | None = None
        self._decided_cdi: bool | None = None
        """Whether the runtime applied CDI at the last decision (``auto``)."""
        self._decided_runtime: str | None = None
        """The ``containerRuntimeVersion`` the last decision read (None: the Node unread)."""
        self._rescan = rescan  # asks discovery for a scan now (a load shows in the next one)
        self.quarantine = quarantine
        self._programmed = programmed  # told of each load (Events)
        self._claim_told = claim_told
        """Told the audit of each function a claim named (Events regarding the claim)."""
        self._loaders = loaders
        """Replaces the loaders the flags choose (in-process tests, the demo)."""
        self._moved = moved
        """Told (now, before, why) when ``auto`` moves the node from one API to the other."""
        self._held = held
        """Told (once per move) which devices the other API still holds, and by whom."""
        self._cdi = cdi
        self._stopping = stopping
        self._withdraw_device_plugin = withdraw_device_plugin
        self._republish = republish
        self.choice: NodeApi | None = NodeApi.DRA if settings.api == "dra" else None
        self.driver: DraDriver | None = None
        self._policies: dict[str, CdiPolicy | None] = {}
        self._feed: DeviceFeed | None = None
        self._resources: list[str] = []
        self._task: asyncio.Task[None] | None = None
        self._kick = asyncio.Event()
        self._decided = asyncio.Event()
        self._decided_for: object = None
        self._decided_pin: Pin | None = None
        """What the label asked of the last decision (None: none made yet)."""
        self._label_reader = LabelReader(settings.node_name or "")
        self._labels: NodeLabelWatch | None = None
        self._label_task: asyncio.Task[None] | None = None
        self._flag_wins_said: set[str] = set()
        self.dra_held: Held = nothing(DRA)
        """Devices claims prepared through DRA still hold after the node moved back to the
        device plugin: advertised Unhealthy to the kubelet until released."""
        self._dra_holds: asyncio.Task[None] | None = None

    @property
    def device_plugin_allowed(self) -> bool:
        """Whether device-plugin servers may serve now (never while DRA does)."""
        return self.choice is NodeApi.DEVICE_PLUGIN

    async def follow(self, node: DeviceSet) -> None:
        if self._feed is not None:  # stopping: the driver's loads still see the devices
            await self._feed.publish(node)

    async def publish(self, node: DeviceSet, groups: dict[str, DeviceSet]) -> None:
        """Specs first, then the devices: a slice may only name devices whose CDI entry is
        on disk. One feed carries the whole node: one driver, one pool."""
        for name in [n for n in self._policies if n not in groups]:
            self._cdi.remove(name)
            del self._policies[name]
        for name, devices in groups.items():
            written = self._cdi.write(name, devices)
            self._policies[name] = CdiPolicy.of(name, devices, "cdi") if written else None
        self._resources = sorted(groups)
        if self._feed is None:
            self._feed = DeviceFeed(node)
            self._start(self._feed)
        else:
            await self._feed.publish(node)

    def _start(self, feed: DeviceFeed) -> None:
        from plugin.programming.quarantine import Quarantine
        from plugin.programming.setup import programmer_for
        from plugin.serving.dra.driver import DraDriver, DriverPlace

        settings = self.settings
        assert settings.node_name is not None
        place = DriverPlace(
            driver=settings.dra_driver_name, node=settings.node_name,
            registry_dir=settings.plugins_registry_dir, state_dir=dra_state_dir(settings),
            cdi_dir=settings.cdi_spec_dir, kubeconfig=settings.kubeconfig,
            request_timeout=settings.api_request_timeout, stop_timeout=settings.stop_timeout,
            chosen_per_kubelet=settings.api == "auto", grants=grants_source(settings),
            kubelet_socket=settings.device_plugin_dir / KUBELET_SOCKET,
            program_at=settings.program_at, pod_resources_socket=settings.pod_resources_socket)
        programmer = programmer_for(settings, self.quarantine or Quarantine(None),
                                    lambda: feed.current, self._rescan, self._programmed,
                                    self._loaders)
        self.driver = DraDriver(place, feed, self.cdi_ids, resources=lambda: self._resources,
                                say_held=self._held, programmer=programmer,
                                claim_told=self._claim_told, shares=settings.dra_share,
                                node_conditions=self._node_conditions)
        self._watch_label(settings.node_name)
        if settings.api == "dra":
            self._task = asyncio.create_task(
                supervise("DRA driver", self.driver.run, finished=self._stopping),
                name="DRA driver")
        else:
            self._task = asyncio.create_task(
                supervise("node API choice", self._choose_forever, finished=self._stopping),
                name="node API choice")
            self.kick()

    def _watch_label(self, node: str) -> None:
        """Follow the Node's label: under ``auto`` to decide by it, under ``dra`` only to
        say once that the flag wins over it."""
        from plugin.serving.dra.node_labels import NodeLabelWatch

        changed = self._label_changed if self.settings.api == "auto" else self._flag_wins
        assert self.driver is not None
        self._labels = NodeLabelWatch(node, self.driver.api, changed,
                                      runtime_changed=self._runtime_changed)
        self._label_task = asyncio.create_task(
            supervise("node label watch", self._labels.run, finished=self._stopping),
            name="node label watch")

    def _label_changed(self, labels: Mapping[str, str]) -> None:
        """A new value: decide again at once if it asks something else of the node."""
        pin = self._label_reader.pin(labels)
        if self._decided_pin is not None and pin.override is not self._decided_pin.override:
            log.info("node %s: %s; deciding again between the device plugin and DRA",
                     self.settings.node_name, pin.said)
            self.kick()

    def _runtime(self) -> Verdict:
        """Whether the node's runtime applies CDI, as last read (None: never read)."""
        return judge(self._labels.runtime if self._labels is not None else None,
                     self.settings.runtime_cdi)

    def _runtime_changed(self, version: str) -> None:
        """A new ``containerRuntimeVersion``: under ``auto`` a new decision if it changes the
        verdict; under ``dra`` said (once per version) where it may not apply CDI, and every
        claim's status written again."""
        verdict = self._runtime()
        if self.settings.api == "auto":
            if self._decided_pin is not None and self._runtime_moved():
                log.info("node %s: %s; deciding again between the device plugin and DRA",
                         self.settings.node_name, verdict.why)
                self.kick()
            return
        if not verdict.applies and version != self._runtime_said:
            self._runtime_said = version
            message = (f"Devices are served through DRA (--api {self.settings.api}), but "
                       f"{verdict.why}: containers may start without their devices, which "
                       "DRA hands over through CDI only")
            log.warning("node %s: %s", self.settings.node_name, message)
            if self._runtime_warning is not None:
                self._runtime_warning(message)
        if self.driver is not None:
            self.driver.node_conditions_changed()

    def _runtime_moved(self) -> bool:
        """Whether the runtime now judges otherwise than at the last decision. A Node first
        read after a decision made without it (the API server was down) is no change: the
        node is decided once per kubelet, as for the API server's own answers."""
        return self._decided_runtime is not None and \
            self._runtime().applies is not self._decided_cdi

    def _node_conditions(self) -> tuple[tuple[str, str, str, str], ...]:
        """What every prepared device's status says of the runtime: nothing where it applies
        CDI or the Node was never read, else :data:`~plugin.serving.runtime_cdi.CONDITION`."""
        if self._labels is None or self._labels.runtime is None:
            return ()
        verdict = self._runtime()
        return () if verdict.applies else ((CONDITION, *verdict.condition),)

    def _flag_wins(self, labels: Mapping[str, str]) -> None:
        pin = self._label_reader.pin(labels)
        if pin is NO_LABEL or pin.override is Override.DRA or pin.said in self._flag_wins_said:
            return
        self._flag_wins_said.add(pin.said)
        log.warning("node %s: %s is not followed: --api %s serves the node through DRA "
                    "whatever the label says (only --api auto follows it)",
                    self.settings.node_name, pin.said, self.settings.api)

    async def device_plugin_may_serve(self) -> bool:
        """Whether a device-plugin server may serve the kubelet there now: it waits for the
        node's API to be decided for that kubelet, so a kubelet that will get DRA never sees
        a device-plugin registration first. If no decision comes in time (an API server that
        does not answer), the device plugin serves: nothing is published through DRA then."""
        loop = asyncio.get_running_loop()
        deadline = (loop.time() + self.settings.watcher_wait
                    + self.settings.api_request_timeout + GATE_SLACK)
        while True:
            kubelet = identity(self.settings.device_plugin_dir / KUBELET_SOCKET)
            if self.choice is not None and kubelet == self._decided_for:
                return self.choice is NodeApi.DEVICE_PLUGIN
            self._decided.clear()
            self.kick()
            try:
                async with asyncio.timeout_at(deadline):
                    await self._decided.wait()
            except TimeoutError:
                log.warning("node %s: no decision between DRA and the device plugin in time; "
                            "serving the device plugin meanwhile", self.settings.node_name)
                return self.choice is not NodeApi.DRA

    def cdi_ids(self, device_id: str) -> list[str]:
        """The CDI IDs of a device, from the spec of the resource it belongs to."""
        for policy in self._policies.values():
            if policy is not None and device_id in policy.names:
                return policy.qualified([device_id])
        return []

    def kick(self) -> None:
        """A kubelet may have started (or the safety net looks): decide again if it did."""
        self._kick.set()

    async def close(self) -> None:
        if self.driver is not None:  # first: no new claim, loads and clears over (stopping.py)
            await self.driver.finish_work()
        label_task, self._label_task = self._label_task, None
        if label_task is not None:  # first: it uses the driver's client, closed below
            label_task.cancel()
            await asyncio.gather(label_task, return_exceptions=True)
        await self._stop_following_claims()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self.driver is not None:
            await self.driver.close()
        self._cdi.remove_all()

    async def self_check(self) -> bool:
        return True if self.driver is None else await self.driver.self_check()

    async def _choose_forever(self) -> None:
        while True:
            await self._kick.wait()
            self._kick.clear()
            kubelet = identity(self.settings.device_plugin_dir / KUBELET_SOCKET)
            if kubelet is None:
                # No kubelet runs (one is restarting): nothing to decide for. The next one's
                # kubelet.sock kicks again; until then the node stays as it is.
                continue
            known = self._label_reader.pin(self._labels.labels if self._labels else None)
            if self.choice is not None and kubelet == self._decided_for and \
                    self._decided_pin is not None and \
                    known.override is self._decided_pin.override and \
                    not self._runtime_moved():
                continue
            pin = self._label_reader.pin(await self._labels.read()) if self._labels else NO_LABEL
            # Read with the labels, from the same Node, and kept as read: a runtime that
            # changes while the kubelet is asked is a change the next kick decides on.
            seen, runtime = self._labels.runtime if self._labels else None, self._runtime()
            choice, why = await self._decide_pinned(kubelet, pin, runtime)
            self._decided_for, self._decided_pin = kubelet, pin
            self._decided_cdi, self._decided_runtime = runtime.applies, seen
            await self._apply(choice, why)

    async def _decide_pinned(self, kubelet: FileIdentity, pin: Pin,
                             runtime: Verdict) -> tuple[NodeApi, str]:
        """:meth:`_decide`, as the label asks: ``device-plugin`` forces the device plugin;
        ``dra`` asks for DRA where it is allowed, and where it is not says why the node
        stays on the device plugin; a new value is named in the reason of the move."""
        if pin.override is Override.DEVICE_PLUGIN:
            return NodeApi.DEVICE_PLUGIN, pin.said
        choice, why = await self._decide(kubelet, runtime)
        if pin.override is Override.DRA:
            if choice is NodeApi.DRA:
                return choice, f"{pin.said}, and {why}"
            log.warning("node %s: %s asks for DRA, but the node stays on the device plugin: "
                        "%s", self.settings.node_name, pin.said, why)
            return choice, f"{pin.said} asks for DRA, but {why}"
        if self._decided_pin is not None and pin.override is not self._decided_pin.override:
            return choice, f"{pin.said} (auto); {why}"
        return choice, why

    async def _decide(self, kubelet: FileIdentity, runtime: Verdict) -> tuple[NodeApi, str]:
        driver = self.driver
        assert driver is not None
        without_cdi = (NodeApi.DEVICE_PLUGIN,
                       f"{runtime.why}, and DRA hands devices to containers only through CDI")
        if runtime.read and not runtime.applies:
            return without_cdi
        if not self.settings.plugins_registry_dir.is_dir():
            return NodeApi.DEVICE_PLUGIN, (f"{self.settings.plugins_registry_dir} does not "
                                           "exist, so no kubelet can register a DRA driver")
        refusal = await driver.api_allows(self._resources)
        if refusal is not None:
            return NodeApi.DEVICE_PLUGIN, refusal
        if not runtime.applies:
            # The Node could not be read: fail safe. Asked after the API server, whose
            # refusal, where it refuses, is the likelier cause and the better reason.
            return without_cdi
        await driver.serve_kubelet()
        wait = self.settings.watcher_wait
        verdict = await driver.kubelet_verdict(kubelet, wait)
        if verdict is None:
            return NodeApi.DEVICE_PLUGIN, f"no kubelet registered the DRA driver within {wait:g} s"
        if not verdict.registered:
            return NodeApi.DEVICE_PLUGIN, f"the kubelet refused the DRA driver: {verdict.error}"
        return NodeApi.DRA, ("the kubelet registered the DRA driver and a DeviceClass maps "
                             f"{', '.join(self._resources)}")

    async def _apply(self, choice: NodeApi, why: str) -> None:
        driver = self.driver
        assert driver is not None
        if choice is not self.choice:
            log.info("node %s: serving its devices through %s: %s", self.settings.node_name,
                     choice.value, why)
            if self.choice is not None and self._moved is not None:
                self._moved(choice.value, self.choice.value, why)
        else:
            log.debug("node %s: still %s: %s", self.settings.node_name, choice.value, why)
        if choice is NodeApi.DRA:
            await self._stop_following_claims()
            self.choice = choice  # first: no device-plugin server is adopted from now on
            self._decided.set()  # servers waiting at the gate learn they will not serve
            await self._withdraw_device_plugin()
            driver.start_publishing()
            return
        # A plugin started on a node that left DRA under an older instance finds the claims
        # that one prepared in the record: read now, while this instance holds the socket.
        recorded = driver.read_record_if_owned()
        await driver.stop_publishing(withdraw=True)
        await driver.stop_serving_kubelet()
        if self.choice is NodeApi.DRA or (self.choice is None and recorded):
            await self._hold_claimed_devices(driver)
        previous, self.choice = self.choice, choice
        self._decided.set()
        if previous is not NodeApi.DEVICE_PLUGIN:
            await self._republish()

    async def _hold_claimed_devices(self, driver: DraDriver) -> None:
        """Moving back to the device plugin: devices of claims still prepared are held out
        (Unhealthy to the kubelet) before any device-plugin server serves, then followed
        until released, each release published at once."""
        await self._stop_following_claims()

        async def changed(held: Held) -> None:
            self.dra_held = held
            if self.device_plugin_allowed:
                await self._republish()

        watch = HoldWatch(self.settings.pod_resources_socket, DRA, driver.claims_held,
                          changed, self._held)
        try:
            self.dra_held = await watch.first()
        except Exception:  # a bug here must not keep the node from being served
            log.exception("cannot tell which devices DRA claims still hold; offering every "
                          "device")
            self.dra_held = nothing(DRA)
        if self.dra_held:
            self._dra_holds = asyncio.create_task(watch.run(), name="DRA claim holds")

    async def _stop_following_claims(self) -> None:
        task, self._dra_holds = self._dra_holds, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self.dra_held = nothing(DRA)
