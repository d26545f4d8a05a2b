"""What every loader promises: load one image or function onto one device, or say why not.

A loader is told the device as discovery saw it (its attributes name the PCI address, the
port, the FME node), the image to load (a file of the node's image library, for Intel GBS
and Alveo xclbin images) or the function ID (an AWS AGFI), and the function ID the device
must report once loaded. It does the load and returns; it does not wait for discovery to see
the new function (the caller does, within its bound) and it never decides whether a load is
needed or allowed (the caller does that before calling).

A failure is a :class:`LoadFailed` naming the step (``open FME node``, ``port-PR ioctl``,
``fpgaconf``, ``xbutil program``...) and the kernel's or the tool's own message, which is
what the claim's error shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from plugin.programming.library import ImageLibrary
from value_types.devices import Device


class LoadFailed(Exception):
    """A load did not happen, or did not complete: ``step`` and the kernel's or tool's
    ``detail``. ``touched`` is False only when the card was certainly not changed (the tool
    was not found, the node could not be opened): then the device's state is still known."""

    def __init__(self, step: str, detail: str, *, touched: bool = True) -> None:
        super().__init__(f"{step}: {detail}")
        self.step = step
        self.detail = detail
        self.touched = touched


@dataclass(frozen=True)
class LoadJob:
    """One load: ``device`` as discovered, the library ``image`` name (None for AWS, loaded
    by ``function_id`` alone) and the ``function_id`` it holds (32 hex digits for an AFU ID
    or xclbin UUID, ``agfi-...`` for AWS)."""

    device: Device
    function_id: str
    library: ImageLibrary | None = None
    image: str | None = None
    timeout: float = 60.0
    """Seconds the load itself may take (a tool is killed past it)."""
    sha256: str | None = None
    """The digest the image's bytes must have (64 lower-case hex digits), when its
    configuration pins one: the loader hashes exactly the bytes it checks and loads, and
    refuses a mismatch (step :data:`~plugin.programming.digest.DIGEST_STEP`,
    ``touched=False``) before anything reaches the card."""


class Loader(Protocol):
    """One way of programming one family of devices (``family`` is a backend name)."""

    name: str
    family: str

    def unavailable(self, device: Device) -> str | None:
        """Why ``device`` cannot be loaded by this loader on this node, or None when it can
        (the tool exists and is executable; the FME node is there)."""
        ...

    async def load(self, job: LoadJob) -> None:
        """Load ``job``; :class:`LoadFailed` when it did not happen."""
        ...

    async def loaded(self, device: Device) -> str | None:
        """The function the device holds now when only the loader can tell (AWS: the SDK's
        describe), normalised as :attr:`LoadJob.function_id`; None where discovery's own
        attributes tell (Intel ``afu_id``, Alveo ``xclbin_uuid``)."""
        ...


class LocalLoader(Loader, Protocol):
    """A loader that programs the card from this process: its async methods run these
    blocking cores in a worker thread, and the ``loader`` process, which holds no event
    loop, calls the cores itself."""

    def load_blocking(self, job: LoadJob) -> None:
        """:meth:`load`, in the calling thread."""
        ...

    def loaded_blocking(self, device: Device) -> str | None:
        """:meth:`loaded`, in the calling thread."""
        ...
