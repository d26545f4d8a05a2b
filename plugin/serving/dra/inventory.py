"""What this node's devices look like as DRA devices: one pool per driver and node.

A pure function of a :class:`~value_types.devices.DeviceSet`, with no I/O and no API version
in sight: the shapes in ``api_versions`` turn a :class:`Pool` into ResourceSlices of whichever
resource.k8s.io version the server speaks, and the driver maps allocated device names back
to device IDs through :meth:`Pool.device_id`.

Device names
    A DRA device name is a DNS label (``[a-z0-9]([-a-z0-9]*[a-z0-9])?``, at most 63), unique
    in its pool; claims, allocation results and the kubelet's prepare calls all carry it, so
    it must be the same for the same device on every scan and after every restart. It is
    therefore a function of the device ID alone, never of the other devices present:

    * a canonical PCI function address, optionally with a port number, spelt as discovery
      spells it (``0000:5e:00.0``, ``0000:3b:00.0-port1``): ``pci-`` and the ID with ``:``
      and ``.`` as ``-`` (``pci-0000-5e-00-0``, ``pci-0000-3b-00-0-port1``);
    * a unit number (``3``): ``unit-3``;
    * anything else: ``dev-``, a readable head of the ID, and 12 hex digits of its SHA-256.

    Only exact canonical spellings take the first two forms (lowercase hex, a four-digit
    domain or one without leading zeros, no leading zero in a unit number), so each of them
    can be read back unambiguously: two IDs never get the same name there. An ID that would
    only collide after spelling (``0000:5E:00.0`` next to ``0000:5e:00.0``, ``a_b`` next to
    ``a.b``) takes the third form, where the digest keeps it apart. The prefixes keep the
    three forms apart; :func:`pool_of` still checks uniqueness, and would rather refuse than
    publish two devices under one name. Intel's DRA drivers spell PCI addresses the same way
    (``0000-00-01-0``, ``DeviceUIDFromPCIinfo``); the prefix says what kind of ID it is.

Attributes
    Standard ones (k8s.io/dynamic-resource-allocation ``deviceattribute``; kubernetes.io
    "Standard Device Attributes for Dynamic Resource Allocation") so that ``matchAttribute``
    constraints line devices up with other drivers' (a NIC on the same NUMA node or root):
    ``resource.kubernetes.io/pciBusID`` (string, the function's address),
    ``resource.kubernetes.io/numaNode`` (int; the scalar form every server accepts, left out
    when the kernel reports none, as the standard asks; the name KEP-6072 made stable in
    Kubernetes 1.37, ``StandardDeviceAttributeNUMANode`` with ``IntValue`` from the
    function's ``numa_node``), ``resource.kubernetes.io/pcieRoot``
    (``pci<domain>:<bus>``) only when discovery read it as ``pcie_root``: the root complex is
    where the function's sysfs path starts, which its address alone does not tell.

    The others are in the driver's own domain, so they are written without one and a
    selector reads them as ``device.attributes["<driver>"].<name>``: C identifiers in
    lowerCamelCase as the reference drivers write theirs (``productName``, ``pciAddress``):
    ``family`` (the discovery backend: ``intel``, ``aws``, ``alveo``, ``units``), and where
    known ``pciVendorID``/``pciDeviceID`` (``0x8086``), ``kernelDriver`` (``intel-fpga``,
    ``dfl``, ``xocl``), Intel ``afuID``, ``interfaceID``, ``card``; Alveo ``shell`` (VBNV),
    ``shellTimestamp`` (int); AWS ``platform`` (``f1``/``f2``), ``slot`` (int, as AWS's tools
    number slots), ``pciSubsystemVendorID``/``pciSubsystemDeviceID`` (with the vendor and
    device IDs, what identifies the loaded image: the AFI ID itself is only in the slot's
    mailbox, which the plugin must not touch). Alveo also ``logicUUID`` (the shell
    partition's logic UUID, 32 hex digits), ``interfaceUUID`` (the one interface UUID an
    xclbin is built against, when the shell lists exactly one) and ``xclbinUUID`` (the xclbin
    loaded now, 36 characters with dashes; absent when none is). Every device carries
    ``programmable`` (bool): whether it can be given another function on this node
    (``--programming on`` and a loader for its family that finds its way in: the FME node or
    ``fpgaconf`` for an Intel port, ``xbutil`` for an Alveo card, the FPGA SDK's tools for an
    AWS slot; see :mod:`plugin.model.programming`). With ``--function-grants``, a device
    holding a function the admin's catalogue guards carries ``functionGuarded`` (bool, true;
    absent otherwise), so the plain class can leave it to the namespaces granted it.
    AWS publishes no shell version
    and no AFI ID: both live only in the slot's mailbox (what ``fpga-describe-local-image``
    reads through the management function's BAR), never in sysfs.
    A value the server would refuse (a string
    over 64 bytes, say a very long VBNV) is left out rather than cut: a selector must never
    match a value the device does not have.

Capacity
    None for a device allocated whole: the model knows no amount (memory, bandwidth) a claim
    could ask a part of. A device published for sharing (``--dra-share``) has one, its
    ``contexts`` (:data:`~value_types.pool.CONTEXTS`): how many users its loaded function
    serves, each share taking one unless it asks more.

Health
    An unhealthy device stays in the pool with ``healthy`` False, its ``health_reason`` (the
    discovery text, for logs and the health stream) and a ``health_code``: a short token that
    fits a taint value (a label value), picked from the first cause in the reason. Whether it
    is published with a taint or left out is the shapes' decision.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping

from plugin.model.programming import Programmable, never
from value_types.devices import Device, DeviceSet
from value_types.pool import (
    DNS_SUBDOMAIN,
    MAX_DRIVER_NAME,
    MAX_NAME,
    AttributeKind,
    AttributeValue,
    DraDevice,
    Pool,
    value_problem,
)

MAX_NODE_NAME = 253
MAX_POOL_NAME = 253

STANDARD_DOMAIN = "resource.kubernetes.io"
PCI_BUS_ID = f"{STANDARD_DOMAIN}/pciBusID"
PCIE_ROOT = f"{STANDARD_DOMAIN}/pcieRoot"
NUMA_NODE = f"{STANDARD_DOMAIN}/numaNode"

FAMILY = "family"
PCI_VENDOR_ID = "pciVendorID"
PCI_DEVICE_ID = "pciDeviceID"
PCI_SUBSYSTEM_VENDOR_ID = "pciSubsystemVendorID"
PCI_SUBSYSTEM_DEVICE_ID = "pciSubsystemDeviceID"
KERNEL_DRIVER = "kernelDriver"
AFU_ID = "afuID"
INTERFACE_ID = "interfaceID"
CARD = "card"
SHELL = "shell"
SHELL_TIMESTAMP = "shellTimestamp"
PLATFORM = "platform"
SLOT = "slot"
LOGIC_UUID = "logicUUID"
INTERFACE_UUID = "interfaceUUID"
XCLBIN_UUID = "xclbinUUID"
PROGRAMMABLE = "programmable"
FUNCTION_GUARDED = "functionGuarded"

KERNEL_DRIVER_FAMILIES = ("intel", "alveo")
"""Backends whose ``driver`` attribute names a kernel driver; AWS's names the platform."""

_BDF_TEXT = r"(?:[0-9a-f]{4}|[1-9a-f][0-9a-f]{4,7}):[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]"
"""A PCI function address exactly as ``plugin.discovery.backends.pci`` writes it."""
_BDF = re.compile(f"^{_BDF_TEXT}$")
_CANONICAL_PCI = re.compile(f"^{_BDF_TEXT}(?:-port(?:0|[1-9][0-9]{{0,5}}))?$")
_UNIT = re.compile(r"^(?:0|[1-9][0-9]{0,56})$")
_DECIMAL = re.compile(r"^[0-9]{1,19}$")
_PCIE_ROOT = re.compile(r"^pci[0-9a-f]{4,8}:[0-9a-f]{2}$")
_PCI_ID = re.compile(r"^0x[0-9a-f]{4}$")
_HEX_ID = re.compile(r"^[0-9a-f]{1,64}$")
_UUID_HEX = re.compile(r"^[0-9a-f]{32}$")
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_NOT_LABEL = re.compile(r"[^a-z0-9]+")
DIGEST_HEX = 12


def device_name(device_id: str) -> str:
    """The DRA name of ``device_id``; see the module docstring for the rule."""
    if _CANONICAL_PCI.match(device_id):
        return "pci-" + device_id.replace(":", "-").replace(".", "-")
    if _UNIT.match(device_id):
        return "unit-" + device_id
    digest = hashlib.sha256(device_id.encode("utf-8", "surrogatepass")).hexdigest()[:DIGEST_HEX]
    room = MAX_NAME - len("dev-") - 1 - DIGEST_HEX
    head = _NOT_LABEL.sub("-", device_id.lower())[:room].strip("-")
    return f"dev-{head}-{digest}" if head else f"dev-{digest}"


_HEALTH_CODES = (
    ("discovery stalled", "discovery-stalled"),
    ("AFU ID is all f", "afu-crashed"),
    ("AFU ID unreadable", "afu-id-unreadable"),
    ("port error register unreadable", "port-error-unreadable"),
    ("port error register", "port-error"),
    ("xocl driver not bound", "driver-unbound"),
    ("card not ready", "card-not-ready"),
    ("readiness unknown", "card-state-unreadable"),
    ("state unknown", "card-state-unreadable"),
    ("card offline", "card-offline"),
    ("card in a bad state", "card-bad-state"),
    ("firewall tripped", "firewall-tripped"),
    ("image being loaded", "image-loading"),
    ("load failed", "load-failed"),
    ("load interrupted", "load-interrupted"),
    ("through its BAR0", "bar0-missing"),
    ("no renderD", "device-node-missing"),
    ("device node", "device-node-missing"),
)
"""Causes discovery names in ``health_reason`` (plugin.discovery.backends and the monitor's
stall), in the order they are tried at one position; the earliest in the text wins."""
UNHEALTHY_CODE = "unhealthy"


def health_code(reason: str) -> str:
    """A label-value token for the first cause in ``reason`` (``unhealthy`` if unknown)."""
    found = [(reason.find(text), index, code) for index, (text, code) in enumerate(_HEALTH_CODES)
             if text in reason]
    return min(found)[2] if found else UNHEALTHY_CODE


def _string(attributes: dict[str, AttributeValue], name: str, value: str | None,
            pattern: re.Pattern[str] | None = None) -> None:
    if not value or (pattern is not None and not pattern.match(value)):
        return
    if not value_problem(AttributeKind.STRING, value):
        attributes[name] = AttributeValue.string(value)


def _integer(attributes: dict[str, AttributeValue], name: str, value: int | str | None) -> None:
    if isinstance(value, str):
        value = int(value) if _DECIMAL.match(value) else None
    if value is not None and not value_problem(AttributeKind.INT, value):
        attributes[name] = AttributeValue.integer(value)


def attributes_of(device: Device, programmable: Programmable = never,
                  guarded: Programmable = never) -> dict[str, AttributeValue]:
    """What a DeviceClass or a claim's CEL selector can see of ``device``; ``programmable``
    says whether it can be given another function here, ``guarded`` whether it holds a
    function the catalogue guards (published true only: the plain class selects the
    devices without it)."""
    facts = device.attrs
    attributes: dict[str, AttributeValue] = {}
    _string(attributes, FAMILY, device.backend)
    _string(attributes, PCI_BUS_ID, facts.get("pci_address"), _BDF)
    _string(attributes, PCIE_ROOT, facts.get("pcie_root"), _PCIE_ROOT)
    _integer(attributes, NUMA_NODE, device.numa_node)
    _string(attributes, PCI_VENDOR_ID, facts.get("vendor"), _PCI_ID)
    _string(attributes, PCI_DEVICE_ID, facts.get("device"), _PCI_ID)
    _string(attributes, PCI_SUBSYSTEM_VENDOR_ID, facts.get("subsystem_vendor"), _PCI_ID)
    _string(attributes, PCI_SUBSYSTEM_DEVICE_ID, facts.get("subsystem_device"), _PCI_ID)
    if device.backend in KERNEL_DRIVER_FAMILIES:
        _string(attributes, KERNEL_DRIVER, facts.get("driver"))
    _string(attributes, AFU_ID, facts.get("afu_id"), _HEX_ID)
    _string(attributes, INTERFACE_ID, facts.get("interface_id"), _HEX_ID)
    _string(attributes, CARD, facts.get("card"))
    _string(attributes, SHELL, facts.get("shell"))
    _integer(attributes, SHELL_TIMESTAMP, facts.get("shell_timestamp"))
    _string(attributes, PLATFORM, facts.get("platform"))
    _integer(attributes, SLOT, facts.get("slot"))
    _string(attributes, LOGIC_UUID, facts.get("logic_uuid"), _UUID_HEX)
    _string(attributes, INTERFACE_UUID, facts.get("interface_uuid"), _UUID_HEX)
    _string(attributes, XCLBIN_UUID, facts.get("xclbin_uuid"), _UUID)
    attributes[PROGRAMMABLE] = AttributeValue.boolean(programmable(device))
    if guarded(device):
        attributes[FUNCTION_GUARDED] = AttributeValue.boolean(True)
    return attributes


def dra_device(device: Device, held_by: str = "", programmable: Programmable = never,
               shared_contexts: int = 0, guarded: Programmable = never) -> DraDevice:
    """``device`` as the pool lists it."""
    return DraDevice(
        held_by=held_by,
        shared_contexts=shared_contexts,
        name=device_name(device.id),
        device_id=device.id,
        attributes=attributes_of(device, programmable, guarded),
        healthy=device.healthy,
        health_reason=device.health_reason,
        health_code="" if device.healthy else health_code(device.health_reason),
    )


def _check_name(what: str, value: str, limit: int) -> None:
    if not value or len(value) > limit or not DNS_SUBDOMAIN.match(value):
        raise ValueError(f"{what} {value!r} is not a lowercase DNS subdomain of at most "
                         f"{limit} characters")


def pool_of(driver: str, node_name: str, devices: DeviceSet,
            pool_name: str | None = None, held: Mapping[str, str] | None = None,
            programmable: Programmable = never,
            shared: Mapping[str, int] | None = None, guarded: Programmable = never) -> Pool:
    """The pool ``driver`` publishes for ``node_name``: every device of the snapshot.

    ``held``: device ID -> the API a running container still holds it through (see
    :attr:`DraDevice.held_by`). The pool is named after the node unless ``pool_name`` says
    otherwise, as the Go helper
    names node-local pools. ``programmable``: the rule for :data:`PROGRAMMABLE`. ``shared``:
    device ID -> the contexts a device is published shared with
    (:mod:`plugin.serving.dra.sharing`); the others are allocated whole. ``guarded``: the
    rule for :data:`FUNCTION_GUARDED` (:mod:`plugin.serving.dra.function_grants`).
    Raises ValueError for a driver, node or pool name the server
    would refuse (a configuration mistake, better found before publishing), or if two IDs
    got one device name (which the naming rule makes all but impossible).
    """
    _check_name("driver name", driver, MAX_DRIVER_NAME)
    _check_name("node name", node_name, MAX_NODE_NAME)
    name = node_name if pool_name is None else pool_name
    if len(name) > MAX_POOL_NAME:
        raise ValueError(f"pool name {name!r} is longer than {MAX_POOL_NAME} characters")
    for part in name.split("/"):
        _check_name("pool name part", part, MAX_POOL_NAME)
    held, shared = held or {}, shared or {}
    listed = tuple(dra_device(d, held.get(d.id, ""), programmable, shared.get(d.id, 0),
                              guarded) for d in devices)
    seen: dict[str, str] = {}
    for entry in listed:
        if entry.name in seen:
            raise ValueError(f"devices {seen[entry.name]!r} and {entry.device_id!r} would both "
                             f"be named {entry.name!r}")
        seen[entry.name] = entry.device_id
    return Pool(driver=driver, node_name=node_name, name=name, devices=listed)
