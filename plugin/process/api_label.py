"""The per-node override of ``--api auto``: the Node label ``accelerator.b-com.com/api``.

An operator pins one node without touching its kubelet::

    kubectl label node NODE accelerator.b-com.com/api=device-plugin --overwrite
    kubectl label node NODE accelerator.b-com.com/api-        # back to auto

========================  =============================================================
value                     what ``--api auto`` does on that node
========================  =============================================================
``device-plugin``         the device plugin, even where DRA would be allowed
``dra``                   DRA, but only where it would be allowed without the label (the
                          kubelet registers the driver, the API server serves
                          resource.k8s.io, a DeviceClass maps every resource name): a
                          node is never served through an API its kubelet does not take,
                          so where one is missing it stays on the device plugin and says why
``auto``, no label        the decision of ``--api auto`` as without the label
anything else             a warning, once per value, and then as without the label
========================  =============================================================

With ``--api dra`` or ``--api device-plugin`` the flag wins: ``dra`` reads the label only to
say, once per value, that it does not follow it; ``device-plugin`` does not read it (the
process may have no API access at all). This module is the pure part: which value means
what, and saying a bad one once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

log = logging.getLogger(__name__)

LABEL = "accelerator.b-com.com/api"


class Override(Enum):
    AUTO = "auto"
    DEVICE_PLUGIN = "device-plugin"
    DRA = "dra"


ACCEPTED = tuple(o.value for o in Override)


@dataclass(frozen=True)
class Pin:
    """What the label asks of one decision, and how to say it in a log line or an Event."""

    override: Override
    said: str


NO_LABEL = Pin(Override.AUTO, f"no label {LABEL}")


class LabelReader:
    """Turns a Node's labels into a :class:`Pin`; a bad value is said once per value."""

    def __init__(self, node: str) -> None:
        self._node = node
        self._bad_said: set[str] = set()

    def pin(self, labels: Mapping[str, str] | None) -> Pin:
        value = (labels or {}).get(LABEL)
        if value is None:
            return NO_LABEL
        try:
            return Pin(Override(value), f"label {LABEL}={value}")
        except ValueError:
            if value not in self._bad_said:
                self._bad_said.add(value)
                log.warning("node %s: label %s=%s is not one of %s; ignored (the node is "
                            "decided as without the label)", self._node, LABEL, value,
                            ", ".join(ACCEPTED))
            return NO_LABEL
