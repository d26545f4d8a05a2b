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

Only the instance that holds the socket publishes and keeps the claim record: a second
instance on the node (a rolling update) waits for the first to stop, then reads the record
the first left and publishes the pool, so two instances never fight over the slices.

The daemon writes the CDI specs (one per resource, as for the device plugin) before it
publishes a device set, so every device in a slice has its CDI entry by the time a claim can
name it; ``cdi_ids`` reads them. Slices stay when the driver stops: a restarting pod publishes
the same pool again, and a kubelet that loses the driver for good deletes them itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from api_versions.k8s_objects import KubeObject
from api_versions.resource_claims import parse_claim
from api_versions.resource_slices import slices_for
from plugin.model.feed import DeviceFeed
from plugin.serving.dra.apiserver import ApiRefused, ApiServer
from plugin.serving.dra.checkpoint import ClaimCheckpoint
from plugin.serving.dra.claim_cdi import ClaimSpecs, accelerator_env
from plugin.serving.dra.claims_model import ClaimAllocation, ClaimRef
from plugin.serving.dra.health import HealthBroadcaster
from plugin.serving.dra.inventory import Pool, pool_of
from plugin.serving.dra.prepare import ClaimPreparer
from plugin.serving.dra.publisher import SlicePublisher
from plugin.serving.dra.service import DraNodeService

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "claims.json"
CONNECT_RETRY_INITIAL = 0.2
CONNECT_RETRY_MAX = 30.0


@dataclass(frozen=True)
class DriverPlace:
    """Where one node's driver lives: its names and its directories."""

    driver: str
    node: str
    registry_dir: Path
    state_dir: Path
    cdi_dir: Path
    kubeconfig: Path | None = None


class DraDriver:
    """Serves the devices of ``feed`` through DRA until cancelled (see the module docstring)."""

    def __init__(self, place: DriverPlace, feed: DeviceFeed,
                 cdi_ids: Callable[[str], list[str]], api: ApiServer | None = None) -> None:
        self.place = place
        self.feed = feed
        self._cdi_ids = cdi_ids
        self._api = api
        self._pool: Pool | None = None
        self._pool_devices: object = None
        self.publisher: SlicePublisher | None = None
        self.service: DraNodeService | None = None

    def pool(self) -> Pool:
        """The pool of the devices now (cached per device set)."""
        devices = self.feed.current
        if self._pool is None or self._pool_devices is not devices:
            self._pool = pool_of(self.place.driver, self.place.node, devices)
            self._pool_devices = devices
        return self._pool

    def device_names(self) -> Mapping[str, str]:
        return self.pool().names

    def build(self, version: str, generation: int, node_uid: str,
              taints: bool) -> list[KubeObject]:
        return slices_for(version, self.pool(), generation, node_uid, taints)

    async def run(self) -> None:
        place = self.place
        api = self._api or await self._connect()

        async def read_claim(ref: ClaimRef) -> ClaimAllocation:
            obj = await api.get_claim(ref.namespace, ref.name)
            # In the version it was read in: another call may have found another since.
            return parse_claim(str(obj["apiVersion"]).rpartition("/")[2], obj)

        place.state_dir.mkdir(parents=True, exist_ok=True)
        checkpoint = ClaimCheckpoint(place.state_dir / CHECKPOINT_FILE, load=False)
        preparer = ClaimPreparer(
            place.driver, place.node, self.device_names, read_claim, self._cdi_ids,
            checkpoint,
            claim_specs=ClaimSpecs(place.cdi_dir, place.driver,
                                   lambda ids: accelerator_env(ids, self.feed.current)))
        health = HealthBroadcaster(place.node, self.feed, self.device_names)
        self.publisher = SlicePublisher(api, place.node, place.driver, self.build)
        self.service = DraNodeService(place.driver, place.registry_dir, preparer, health)
        log.info("serving %d devices through DRA as driver %s, pool %s", len(self.feed.current),
                 place.driver, place.node)
        await self.service.start()
        follower = asyncio.create_task(self._follow_devices(), name="DRA device follower")
        try:
            # One instance per node is the driver: the one holding the socket. A newcomer
            # (a rolling update) waits for the old one to stop before it reads the claims
            # that one recorded and before it writes slices, so two never fight over them.
            await self.service.wait_serving()
            checkpoint.load()
            await self.publisher.run()
        finally:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower
            await self.service.stop()
            await health.close()
            await api.close()

    async def _connect(self) -> ApiServer:
        """The API client, once its configuration can be read: a kubeconfig or service
        account that is missing or broken is said once and tried again with back-off, not
        raised into the supervisor at every try (a traceback each time)."""
        delay, said = CONNECT_RETRY_INITIAL, None
        while True:
            try:
                api = ApiServer.connect(self.place.kubeconfig)
            except ApiRefused as refusal:
                if str(refusal) != said:
                    log.error("DRA driver %s: %s; trying again with back-off, up to every "
                              "%g s", self.place.driver, refusal, CONNECT_RETRY_MAX)
                    said = str(refusal)
                await asyncio.sleep(delay)
                delay = min(delay * 2, CONNECT_RETRY_MAX)
                continue
            if said is not None:
                log.info("DRA driver %s: the API server configuration can be read now",
                         self.place.driver)
            return api

    async def _follow_devices(self) -> None:
        async for _devices in self.feed.subscribe():
            if self.publisher is not None:
                self.publisher.devices_changed()

    async def self_check(self) -> bool:
        return True if self.service is None else await self.service.self_check()
