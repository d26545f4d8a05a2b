"""Which devices make the scheduler wait for their function before it binds a pod (KEP-5007).

With ``--programming on --program-at bind`` every programmable device is published with one
binding condition, ``<driver>/FunctionReady``, and one binding failure condition,
``<driver>/FunctionFailed``. The scheduler copies both into each allocation result of such a
device, binds the claim (its ``reservedFor``), then waits in PreBind until the driver sets
``FunctionReady`` True in the claim's ``status.devices[]`` entry for that device, or gives the
allocation up as soon as ``FunctionFailed`` is True, or after its ``bindingTimeout`` (600 s by
default), and schedules the pod again: the function is loaded while the pod waits, and a
failed load sends it to another device instead of leaving it on this node
(:mod:`.binding` does the driver's part).

A device that cannot be programmed here carries neither: a claim of it is served at prepare
as before, where only a function it already holds can be given. ``--program-at prepare``
(the default) publishes exactly what was published before this setting existed.
"""

from __future__ import annotations

from dataclasses import replace

from plugin.serving.dra.inventory import PROGRAMMABLE
from value_types.pool import Pool

READY = "FunctionReady"
FAILED = "FunctionFailed"


def ready_condition(driver: str) -> str:
    """The binding condition: the device holds the claim's function."""
    return f"{driver}/{READY}"


def failed_condition(driver: str) -> str:
    """The binding failure condition: the claim's function cannot be given on this device."""
    return f"{driver}/{FAILED}"


def with_binding_conditions(pool: Pool) -> Pool:
    """``pool`` with the binding conditions on every device published programmable."""
    ready, failed = (ready_condition(pool.driver),), (failed_condition(pool.driver),)
    devices = tuple(
        replace(d, binding_conditions=ready, binding_failure_conditions=failed)
        if (value := d.attributes.get(PROGRAMMABLE)) is not None and value.value is True
        else d for d in pool.devices)
    return replace(pool, devices=devices)
