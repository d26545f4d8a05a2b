"""What the driver last loaded onto each device, from which bytes, for whom: kept for ``discover``.

A device reports the function it holds (an AFU ID, an xclbin UUID), never which file or bytes
it came from. The driver knows for the loads it made: after each one it records the function,
the image, the digest of the bytes loaded and the claim, in a small file of its state
directory beside the checkpoint. ``discover`` shows the digest next to what a device holds
only while the device still reports the recorded function: a device loaded since by other
means (an admin's tool) shows no digest rather than a wrong one.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from types import MappingProxyType

from plugin.process.files import replace_atomically

log = logging.getLogger(__name__)

FILE_NAME = "programming-loads.json"


@dataclass(frozen=True)
class LoadRecord:
    """One device's last load by this driver."""

    function_id: str
    function: str
    image: str | None
    sha256: str | None
    claim: str
    at: str


class LoadRecords:
    """Device ID -> its last load, in ``state_dir`` (None: kept nowhere)."""

    def __init__(self, state_dir: Path | None) -> None:
        self.path = None if state_dir is None else state_dir / FILE_NAME
        self._read: tuple[object, Mapping[str, LoadRecord]] = (None, MappingProxyType({}))

    def current(self) -> Mapping[str, LoadRecord]:
        """The records the file holds now, read again only when a ``stat`` says it changed
        (every write replaces it: a new inode): the DRA driver's sharing decision asks on
        every change of what its claims hold, and a read and parse each time would be paid
        by every prepare."""
        if self.path is None:
            return MappingProxyType({})
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return MappingProxyType({})
        except OSError:
            stat = None
        key = None if stat is None else (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        if key is None or key != self._read[0]:
            self._read = (key, MappingProxyType(read_records(self.path.parent)))
        return self._read[1]

    def loaded(self, device_id: str, record: LoadRecord) -> None:
        """Record a load that succeeded; a write that fails costs ``discover`` its digest,
        never the claim."""
        if self.path is None:
            return
        records = read_records(self.path.parent)
        records[device_id] = record
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            replace_atomically(self.path, json.dumps(
                {"devices": {k: asdict(v) for k, v in sorted(records.items())}},
                sort_keys=True))
        except OSError as exc:
            log.warning("cannot write %s (%s); discover will not show what %s was loaded "
                        "from", self.path, exc.strerror, device_id)


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def read_records(state_dir: Path) -> dict[str, LoadRecord]:
    """The records kept in ``state_dir``; none where the file is missing or unreadable."""
    try:
        data = json.loads((state_dir / FILE_NAME).read_text())
        entries = data["devices"]
        return {str(device_id): LoadRecord(**entry) for device_id, entry in entries.items()}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        log.warning("%s cannot be read (%s); what devices were loaded from is not shown",
                    state_dir / FILE_NAME, exc)
        return {}
