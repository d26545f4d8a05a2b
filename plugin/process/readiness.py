"""Whether the node's devices reach its kubelet now, as ``/readyz`` says it.

Ready means the node is served through the API it is served through now:

* the device plugin: every resource the devices make is registered with the kubelet that
  runs now (a kubelet that went away takes readiness with it until the next one registers
  the resource), or waits for another live instance of this plugin to release its socket:
  that instance serves the node meanwhile, and a rolling update with surge stops the old
  pod only once the new one is ready, so counting the wait as not ready would stall it;
* DRA: the node's pool is published (the last write of its ResourceSlices succeeded), or
  the driver's socket is held by another instance, for the same reason;
* ``--api auto``: whichever of the two the node is served through now; not ready while the
  choice is being made for the kubelet that runs.

Everything here runs on the event loop, where the state is written (see
:mod:`plugin.process.probe_server`), and only reads.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING

from plugin.process.dra_side import DraSide, NodeApi
from plugin.process.liveness import Verdict

if TYPE_CHECKING:
    from plugin.serving.dra.driver import DraDriver

Readiness = Callable[[], tuple[bool, str]]
"""A resource server's ``readiness`` method."""


def node_readiness(expected: Collection[str] | None, servers: Mapping[str, Readiness],
                   dra_side: DraSide | None) -> Verdict:
    """``expected``: the resource names of the last device set (None: no scan ended yet);
    ``servers``: the device-plugin servers' ``readiness``, by resource name."""
    if expected is None:
        return Verdict(False, "no device scan has completed yet")
    if dra_side is not None:
        if dra_side.choice is None:
            return Verdict(False, "choosing between DRA and the device plugin for the "
                                  "kubelet that runs now")
        if dra_side.choice is NodeApi.DRA:
            return dra_readiness(dra_side.driver)
    return device_plugin_readiness(expected, servers)


def device_plugin_readiness(expected: Collection[str],
                            servers: Mapping[str, Readiness]) -> Verdict:
    if not expected:
        return Verdict(True, "no devices on this node, so nothing to register")
    answers = []
    for name in sorted(expected):
        server = servers.get(name)
        ok, why = (False, "not served yet") if server is None else server()
        answers.append((ok, f"{name}: {why}"))
    failing = [why for ok, why in answers if not ok]
    if failing:
        return Verdict(False, "; ".join(failing))
    return Verdict(True, "; ".join(why for _, why in answers))


def dra_readiness(driver: DraDriver | None) -> Verdict:
    if driver is None:
        return Verdict(False, "the DRA driver has not started")
    service = driver.service
    if service is None:
        return Verdict(False, f"DRA driver {driver.place.driver} does not serve the kubelet")
    if service.waiting_for is not None:
        return Verdict(True, f"DRA driver {driver.place.driver}: {service.waiting_for}; this "
                             "instance takes over when it stops")
    if not service.serving:
        return Verdict(False, f"DRA driver {driver.place.driver}: {service.socket_path} is "
                              "not served yet")
    publisher = driver.publisher
    pool = f"the pool of node {driver.place.node}"
    if publisher is None or publisher.in_sync is None:
        return Verdict(False, f"{pool} is not published yet")
    if not publisher.in_sync:
        return Verdict(False, f"{pool} is not published: {publisher.problem}")
    return Verdict(True, f"{pool} is published (generation {publisher.generation}, "
                         f"driver {driver.place.driver})")
