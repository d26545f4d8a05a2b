"""Devices a failed load left in an unknown state: Unhealthy until shown sound again.

A partial reconfiguration or an ``xbutil program`` that fails half-way can leave a region
holding part of a bitstream, or nothing; what discovery reads afterwards (the old AFU ID
still in ``afu_id``, say) does not prove the logic behind it works. So such a device is
reported Unhealthy, to the scheduler (taint) and the kubelet (health stream) alike, with the
failure as its reason, until:

* a later load onto it succeeds (an admin's claim that tolerates the taint, say), or
* discovery stops listing it: the kernel removed the device (driver unbound, PCI removal,
  a reboot), and when it comes back it is enumerated afresh.

Only failures that may have touched the card count (a tool that is missing, or an image
refused before loading, leaves the device as it was). The set is kept in a small file in the
driver's state directory, so a restarted plugin does not report a half-loaded device Healthy.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from plugin.process import metrics
from plugin.serving.files import replace_atomically
from value_types.devices import Device, DeviceSet, Health

log = logging.getLogger(__name__)

FILE_NAME = "programming-quarantine.json"
REASON_PREFIX = "load failed"
"""How the health reason starts, for the health code (``load-failed``)."""


class Quarantine:
    """Device ID -> why its state is unknown; ``changed`` is told after every change."""

    def __init__(self, state_dir: Path | None, changed: Callable[[], None] = lambda: None
                 ) -> None:
        self.path = None if state_dir is None else state_dir / FILE_NAME
        self._changed = changed
        self.reasons: dict[str, str] = {}
        self.owned = False
        """True once this instance holds the driver's socket: only then does it write."""
        self._read()

    def take_ownership(self) -> None:
        """This instance holds the socket now (a rolling update's newcomer takes over): the
        file, which the instance before it kept until it stopped, is the truth."""
        self.owned = True
        before = dict(self.reasons)
        self._read()
        if self.reasons != before:
            self._changed()

    def add(self, device_id: str, reason: str) -> None:
        text = f"{REASON_PREFIX}: {reason}; its state is unknown until a load succeeds"
        if self.reasons.get(device_id) == text:
            return
        self.reasons[device_id] = text
        log.warning("device %s is Unhealthy: %s", device_id, text)
        self._save_and_tell()

    def clear(self, device_id: str) -> None:
        if self.reasons.pop(device_id, None) is not None:
            log.info("device %s: a load succeeded; its state is known again", device_id)
            self._save_and_tell()

    def apply(self, devices: DeviceSet) -> DeviceSet:
        """``devices`` with every quarantined one Unhealthy; IDs discovery no longer lists
        are forgotten (the device was removed, and comes back enumerated afresh)."""
        gone = [device_id for device_id in self.reasons if device_id not in devices]
        for device_id in gone:
            log.info("device %s is gone from the node; its failed load is forgotten", device_id)
            del self.reasons[device_id]
        if gone:
            self._save()
        if not self.reasons:
            return devices
        return DeviceSet.of(_marked(device, self.reasons.get(device.id)) for device in devices)

    def _read(self) -> None:
        if self.path is None:
            return
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.error("%s cannot be read (%s); devices whose last load failed may be "
                      "reported Healthy", self.path, exc)
            return
        if not isinstance(data, dict) or not isinstance(data.get("devices"), dict):
            log.error("%s holds no device list; devices whose last load failed may be "
                      "reported Healthy", self.path)
            return
        found = {str(k): str(v) for k, v in data["devices"].items()}
        if found and found != self.reasons:
            log.warning("devices Unhealthy since a failed load: %s", ", ".join(sorted(found)))
        self.reasons = found
        metrics.devices_load_failed(len(found))

    def _save(self) -> None:
        metrics.devices_load_failed(len(self.reasons))
        if self.path is None or not self.owned:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            replace_atomically(self.path, json.dumps({"devices": self.reasons}, sort_keys=True))
        except OSError as exc:
            log.error("cannot write %s (%s); a restart would forget which devices a failed "
                      "load left unknown", self.path, exc.strerror)

    def _save_and_tell(self) -> None:
        self._save()
        self._changed()


def _marked(device: Device, reason: str | None) -> Device:
    if reason is None:
        return device
    joined = reason if device.healthy else f"{device.health_reason}; {reason}"
    return replace(device, health=Health.UNHEALTHY, health_reason=joined)
