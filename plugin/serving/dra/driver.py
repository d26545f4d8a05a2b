"""The DRA driver of one node: its pool published, its claims prepared, its health streamed.

What the Go helper (k8s.io/dynamic-resource-allocation) hands a driver, put together from this
package's parts over the one device feed the daemon keeps for the whole node:

* :class:`~plugin.serving.dra.publisher.SlicePublisher` makes the API server's ResourceSlices
  agree with the devices (shapes from :mod:`api_versions.resource_slices`);
* :class:`~plugin.serving.dra.service.DraNodeService` is the socket the kubelet's plugin
  watcher registers and the kubelet calls: NodePrepareResources through
  :class:`~plugin.serving.dra.prepare.ClaimPreparer` (claims read from the API server,
  recorded in the driver's own checkpoint), and the health stream from
  :class:`~plugin.serving.dra.health.HealthBroadcaster`.

The daemon writes the CDI specs (one per resource, as for the device plugin) before it
publishes a device set, so every device in a slice has its CDI entry by the time a claim can
name it; ``cdi_ids`` reads them. Slices stay when the driver stops: a restarting pod publishes
the same pool again, and a kubelet that loses the driver for good deletes them itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping
from functools import partial

from api_versions.claim_status import status_apply
from api_versions.device_classes import extended_resource_names
from api_versions.k8s_objects import KubeObject, api_version_of
from api_versions.podresources import Listing
from api_versions.resource_claims import parse_claim
from api_versions.resource_slices import slices_for
from api_versions.watcher import RegistrationOutcome
from plugin.model.feed import DeviceFeed
from plugin.model.held import (
    DEVICE_PLUGIN,
    Held,
    held_through_dra,
    nothing,
    still_held_through_device_plugin,
)
from plugin.model.programming import never
from plugin.process import metrics
from plugin.programming.outcome import Outcome
from plugin.programming.programmer import Programmer
from plugin.serving.dra.apiserver import ApiFailure, ApiServer
from plugin.serving.dra.binding_conditions import with_binding_conditions
from plugin.serving.dra.binding_watch import BindingSide
from plugin.serving.dra.checkpoint import ClaimCheckpoint
from plugin.serving.dra.claim_cdi import ClaimSpecs, accelerator_env
from plugin.serving.dra.claim_status import ClaimStatusReporter, NodeConditions
from plugin.serving.dra.claims_held import live_claims
from plugin.serving.dra.connect import connect
from plugin.serving.dra.function_audit import Auditor, ClaimTold
from plugin.serving.dra.function_grants import FunctionGrants, held_on
from plugin.serving.dra.health import HealthBroadcaster
from plugin.serving.dra.inventory import pool_of
from plugin.serving.dra.place import DriverPlace
from plugin.serving.dra.prepare import ClaimPreparer
from plugin.serving.dra.publisher import SlicePublisher
from plugin.serving.dra.service import DraNodeService
from plugin.serving.dra.share_setting import FamilyShare
from plugin.serving.dra.sharing import DRAINING, Sharing
from plugin.serving.dra.stopping import finish_work
from plugin.serving.holds import HoldWatch
from plugin.serving.routing import FileIdentity, identity
from value_types.claims import ClaimAllocation, ClaimRef, DeviceStatusReport
from value_types.pool import Pool

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "claims.jsonl"


class DraDriver:
    """The DRA side of one node (see the module docstring).

    With ``--api dra`` :meth:`run` serves the kubelet and publishes until cancelled. With
    ``--api auto`` the daemon drives the parts itself: :meth:`api_allows` and
    :meth:`kubelet_verdict` say whether this node can be served through DRA, and publishing
    starts and stops as the node moves between the device plugin and DRA.
    """

    def __init__(self, place: DriverPlace, feed: DeviceFeed,
                 cdi_ids: Callable[[str], list[str]], api: ApiServer | None = None, *,
                 resources: Callable[[], Iterable[str]] = tuple,
                 say_held: Callable[[str], None] | None = None,
                 programmer: Programmer | None = None,
                 claim_told: ClaimTold | None = None,
                 node_conditions: NodeConditions = tuple,
                 shares: tuple[FamilyShare, ...] = ()) -> None:
        self.place = place
        self.sharing = Sharing.of(shares, programmer)
        """``--dra-share``: which devices are published shared, with how many contexts."""
        self._claim_told = claim_told
        """Events regarding a claim: the audit of each function it named."""
        self._node_conditions = node_conditions
        self.programmer = programmer
        """Loads the function a claim names (and says which devices can take one)."""
        self.grants = FunctionGrants(place.driver, place.grants, self.api, held_on(
            lambda: feed.current, programmer)) if place.grants is not None else None
        self._resources = resources
        """The device plugin's resource names for these devices (what PodResources lists
        device-plugin devices under)."""
        self._say_held = say_held
        self.held: Held = nothing(DEVICE_PLUGIN)
        """Devices containers still hold through the device plugin (after a move to DRA)."""
        self._holds: asyncio.Task[None] | None = None
        self.feed, self._cdi_ids, self._api = feed, cdi_ids, api
        self._pool: Pool | None = None
        self._pool_made_of: tuple[object, ...] = ()
        """(devices, device plugin holds, (programmable, guarded), clearing, claim holds,
        shared, draining)."""
        self._preparer: ClaimPreparer | None = None
        self._health: HealthBroadcaster | None = None
        self._status: ClaimStatusReporter | None = None
        self._binding: BindingSide | None = None
        self._follower: asyncio.Task[None] | None = None
        self._publishing: asyncio.Task[None] | None = None
        self.publisher: SlicePublisher | None = None
        self.service: DraNodeService | None = None

    def pool(self) -> Pool:
        """The pool of the devices now, built again only when what it is made of changed:
        a share prepared or unprepared changes the claims' holds, but rarely which devices
        are published shared, and then the pool (and its slices) stay as they are."""
        programmable = (self.programmer.generation() if self.programmer is not None else (),
                        self.grants.publishing() if self.grants is not None else None)
        holds = self.sharing.holds(self._preparer.checkpoint if self._preparer else None)
        clearing = self._preparer.clears.draining() if self._preparer else frozenset()
        made_of = (self.feed.current, self.held, programmable, clearing, holds)
        if self._pool is None or self._pool_made_of[:5] != made_of:
            shared = self.sharing.contexts(self.feed.current, holds)
            draining = self.sharing.draining()  # published in use: no new share lands
            if self._pool is None or self._pool_made_of[:4] != made_of[:4] \
                    or self._pool_made_of[5:] != (shared, draining):
                held = dict.fromkeys(draining | clearing, DRAINING)
                held.update((device_id, DEVICE_PLUGIN) for device_id in self.held.devices)
                self._pool = pool_of(self.place.driver, self.place.node, self.feed.current,
                                     held=held, shared=shared,
                                     programmable=self.programmer.programmable
                                     if self.programmer is not None else never,
                                     guarded=self.grants.publishes_guarded
                                     if self.grants is not None else never)
                if self._binding is not None:
                    self._pool = with_binding_conditions(self._pool)
            self._pool_made_of = (*made_of, shared, draining)
        return self._pool

    def device_names(self) -> Mapping[str, str]:
        return self.pool().names

    def published_contexts(self) -> Mapping[str, int]:
        """Device ID -> contexts of each device the pool publishes shared now: a share is
        prepared only on one of these."""
        return {d.device_id: d.shared_contexts for d in self.pool().devices
                if d.shared_contexts}

    def build(self, version: str, generation: int, node_uid: str,
              taints: bool) -> list[KubeObject]:
        return slices_for(version, self.pool(), generation, node_uid, taints)

    @property
    def publishing(self) -> bool:
        return self._publishing is not None

    async def run(self) -> None:
        """``--api dra``: serve the kubelet and publish until cancelled."""
        try:
            await self.serve_kubelet()
            self.start_publishing()
            await asyncio.Event().wait()
        finally:
            await self.close()

    async def serve_kubelet(self) -> None:
        """Put the driver's socket in the kubelet's plugin registry (idempotent)."""
        if self.service is not None:
            return
        place = self.place
        if self._api is None:
            self._api = await connect(self.place.kubeconfig, self.place.request_timeout,
                                      self.place.driver)
        api = self._api

        async def read_claim(ref: ClaimRef) -> ClaimAllocation:
            obj = await api.get_claim(ref.namespace, ref.name)
            # In the version it was read in: another call may have found another since.
            return parse_claim(api_version_of(obj), obj, place.driver)

        async def write_status(ref: ClaimRef, reports: tuple[DeviceStatusReport, ...]) -> None:
            await api.apply_claim_status(lambda version: status_apply(version, ref, reports),
                                         field_manager=place.driver)

        if self._preparer is None:
            place.state_dir.mkdir(parents=True, exist_ok=True)
            self._status = ClaimStatusReporter(
                place.driver, lambda: self.feed.current, write_status,
                function_of=self._function_of, node_conditions=self._node_conditions)
            # Read at first use, which comes through the socket: only the instance holding
            # it reads the record (a rolling update's newcomer waits for the old one first).
            checkpoint = ClaimCheckpoint(place.state_dir / CHECKPOINT_FILE, load=False)
            self._preparer = ClaimPreparer(
                place.driver, place.node, self.device_names, read_claim, self._cdi_ids,
                checkpoint, claim_specs=ClaimSpecs(
                    place.cdi_dir, place.driver,
                    lambda ids: accelerator_env(ids, self.feed.current)),
                on_prepared=self.sharing.republishing(self._status.prepared, self._republish),
                on_unprepared=self.sharing.republishing(self._status.unprepared,
                                                        self._republish),
                held=self._held_by, programmer=self.programmer,
                auditor=Auditor(self._claim_told), refused_in_status=self._status.refused,
                published_contexts=self.published_contexts, device_classes=api.device_classes,
                published_shares=lambda: self.sharing.shared_as)  # as published_contexts
            self._preparer.functions.grants = self.grants
            metrics.follow_dra_prepared_claims(place.driver, checkpoint.held)
            self._binding = BindingSide.of(place, api, self._preparer, self._claim_told)
            self._pool = None  # built again, with the binding conditions if any
            self._health = HealthBroadcaster(place.node, self.feed, self.device_names)
            self._follower = asyncio.create_task(self._follow_devices(),
                                                 name="DRA device follower")
        self.service = DraNodeService(place.driver, place.registry_dir, self._preparer,
                                      self._health, refusal_expected=place.chosen_per_kubelet,
                                      kubelet_instance=self.kubelet_instance)
        log.info("serving %d devices through DRA as driver %s, pool %s",
                 len(self.feed.current), place.driver, place.node)
        await self.service.start()

    async def stop_serving_kubelet(self) -> None:
        service, self.service = self.service, None
        if service is not None:
            await service.stop()

    def kubelet_instance(self) -> FileIdentity | None:
        """The kubelet running now (None: none, or no ``kubelet_socket`` to tell)."""
        path = self.place.kubelet_socket
        return None if path is None else identity(path)

    async def kubelet_verdict(self, instance: FileIdentity,
                              timeout: float) -> RegistrationOutcome | None:
        """Kubelet ``instance``'s word on the driver's registration; None when it said
        nothing within ``timeout`` seconds."""
        assert self.service is not None, "serve_kubelet first"
        return await self.service.verdict_of(instance, timeout)

    def api(self) -> ApiServer:
        """The driver's API client, made at first use (:class:`ApiRefused` when its
        configuration cannot be read); the node's label watch shares it."""
        if self._api is None:
            self._api = ApiServer.connect(self.place.kubeconfig, self.place.request_timeout)
        return self._api

    async def api_allows(self, resource_names: Iterable[str]) -> str | None:
        """Why the API server does not let this node be served through DRA, or None: it
        must serve a resource.k8s.io version the driver speaks, and a DeviceClass must map
        each resource name (otherwise pods asking for it by name would find nothing)."""
        try:
            api = self.api()
            version = await api.resource_version()
            mapped = extended_resource_names(await api.device_classes())
        except ApiFailure as failure:
            return f"the API server cannot tell ({failure})"
        missing = sorted(set(resource_names) - set(mapped))
        if missing:
            return (f"no DeviceClass maps {', '.join(missing)} (spec.extendedResourceName), "
                    f"so pods asking for it by name would find nothing through DRA "
                    f"(resource.k8s.io/{version} is served)")
        return None

    def _function_changed(self, republish: Callable[[], None]) -> Callable[[], None]:
        """What to call when a load or a clear ended: the slots only a describe reads are
        described again, for ``functionGuarded``."""
        grants = self.grants
        if grants is None:
            return republish

        def ended() -> None:
            grants.slots.stale()
            republish()
        return ended

    def start_publishing(self) -> None:
        """Publish once the driver holds its socket (serve_kubelet first): one instance per
        node is the driver, and a rolling update's newcomer must not fight the old one's
        slices while it waits for that one to stop."""
        if self._publishing is not None:
            return
        assert self._api is not None and self.service is not None, "serve_kubelet first"
        publisher = SlicePublisher(self._api, self.place.node, self.place.driver, self.build)
        self.publisher = publisher
        if self.programmer is not None:  # a load or a clear ended: no longer draining
            self.programmer.on_changed = self._function_changed(
                self.sharing.drained(self._republish))
            self.programmer.clears.on_resumed_over = self._republish
            # A loader process's word changed: republish.
            self.programmer.on_loaders_changed = partial(
                asyncio.get_running_loop().call_soon_threadsafe,
                lambda: self._holds_changed(self.held))
        if self.grants is not None:  # what is guarded changed: functionGuarded follows
            self.grants.on_changed = self._republish
        service, preparer, status = self.service, self._preparer, self._status

        async def publish() -> None:
            await service.wait_serving()
            if preparer is not None:
                preparer.checkpoint.load()  # the socket is ours: so is the record (said now)
                if self.programmer is not None:
                    self.programmer.take_ownership()
                if preparer.checkpoint.unavailable() is None:  # before the first slice
                    preparer.clears.take_over()
                if status is not None:
                    status.follow(preparer.checkpoint.claims.values())
            try:  # before the first slice: a held device is never offered, not even once
                watch = await self._devices_held()
            except Exception:  # a bug here must not keep the node from being published
                log.exception("cannot tell which devices the device plugin still holds; "
                              "offering every device")
                watch = None
            if watch is not None and watch.held:
                self._holds = asyncio.create_task(watch.run(), name="device-plugin holds")
            if self._binding is not None:
                self._binding.start(self.device_names)
            await asyncio.gather(publisher.run(), *[g.run() for g in (self.grants,) if g])

        self._publishing = asyncio.create_task(publish(), name="slice publisher")

    async def stop_publishing(self, withdraw: bool) -> None:
        """Stop publishing; with ``withdraw`` delete the pool's slices, so the scheduler
        stops placing DRA claims on a node that no longer serves them."""
        task, self._publishing = self._publishing, None
        holds, self._holds = self._holds, None
        if self._binding is not None:
            await self._binding.stop()
        if holds is not None:
            holds.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await holds
        self.held = nothing(DEVICE_PLUGIN)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        publisher, self.publisher = self.publisher, None
        if withdraw and publisher is not None:
            await publisher.withdraw()

    async def finish_work(self) -> None:
        """Stopping: no new claim, the loads and clears under way over (:mod:`.stopping`)."""
        await finish_work(self._preparer, self.programmer, self.place.stop_timeout)

    async def close(self) -> None:
        """Stop taking claims, finish (or after ``stop_timeout`` cut off) the loads and
        clears under way, and only then give up the socket a rolling update's newcomer waits
        for: it must not program a card this instance is still writing."""
        await self.finish_work()
        await self.stop_publishing(withdraw=False)
        await self.stop_serving_kubelet()
        if self._follower is not None:
            self._follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._follower
            self._follower = None
        if self._health is not None:
            await self._health.close()
        if self._status is not None:
            await self._status.close()
        if self._api is not None:
            await self._api.close()
            self._api = None

    def _function_of(self, uid: str, device_id: str) -> Outcome | None:
        """What was done to give claim ``uid``'s device its function, as recorded."""
        claim = self._preparer.checkpoint.get(uid) if self._preparer is not None else None
        return claim.function(device_id) if claim is not None else None

    def _held_by(self) -> dict[str, str]:
        return {device_id: f"held by {', '.join(holders)}"
                for device_id, holders in self.held.devices.items()}

    async def _devices_held(self) -> HoldWatch | None:
        """Ask the kubelet which of these devices containers still hold through the device
        plugin (a kubelet upgraded in place keeps them running), said once; the watch that
        follows them until released, or None when nothing is asked."""
        socket = self.place.pod_resources_socket
        if socket is None:
            return None

        async def compute(listing: Listing | None, before: Held) -> Held:
            return still_held_through_device_plugin(listing, before, set(self._resources()),
                                                    set(self.feed.current.ids))

        watch = HoldWatch(socket, DEVICE_PLUGIN, compute, self._holds_changed, self._say_held)
        self._holds_changed(await watch.first())
        return watch

    def read_record_if_owned(self) -> int:
        """Read the claim record if this instance holds the DRA socket (the kubelet answered
        through it), as publishing does; how many claims it records (0 when not read)."""
        preparer, service = self._preparer, self.service
        if preparer is None or service is None or not service.serving:
            return 0
        preparer.checkpoint.load()
        return len(preparer.checkpoint)

    async def claims_held(self, listing: Listing | None, before: Held) -> Held:
        """Devices of claims this driver prepared whose pods may still run (the node moved
        back to the device plugin, whose kubelet no longer calls unprepare): a recorded
        claim holds its devices until the API server says it is gone, replaced, or reserved
        for no pod; where the server cannot tell, it still holds them. Plus the claims the
        kubelet's PodResources lists for this driver (1.34+)."""
        preparer = self._preparer
        # Only a record this instance owns and read already: reading it here would cache it
        # in an instance that does not hold the socket (a rolling update's newcomer).
        owned = preparer is not None and preparer.checkpoint.held() is not None
        recorded = list(preparer.checkpoint.claims.values()) if owned and preparer else []
        live = await live_claims(self._api, recorded, self.place.node)
        return held_through_dra(live, listing, self.place.driver, self.device_names())

    def _republish(self) -> None:
        self._holds_changed(self.held)

    def _holds_changed(self, held: Held) -> None:
        self.held = held
        if self.publisher is not None:
            self.publisher.devices_changed()

    async def _follow_devices(self) -> None:
        async for _devices in self.feed.subscribe():
            if self.programmer is not None:
                self.programmer.devices_changed()
            if self.publisher is not None:
                self.publisher.devices_changed()
            if self._status is not None:
                self._status.devices_changed()

    def node_conditions_changed(self) -> None:
        """The node-wide conditions changed: every claim's status is written again."""
        if self._status is not None:
            self._status.devices_changed()

    async def self_check(self) -> bool:
        return True if self.service is None else await self.service.self_check()
