"""What an image must pass before a device is given its function: the fit, then the bytes.

The function's family must be the device's, the image must hold the function and fit the
device (:mod:`.image_checks`, one ``stat`` once its header is known), and where the
configuration pins a ``sha256`` the file's bytes must have it (hashed once per file version);
``--require-image-digest`` makes the pin compulsory. Each refusal is a
:class:`ProgrammingRefused` naming the device, the function and why, counted in
``dra_programming_total`` under its result (``refused``, ``digest_mismatch``).
"""

from __future__ import annotations

from plugin.process import metrics
from plugin.programming.function_config import FunctionSpec
from plugin.programming.image_checks import DigestMismatch, ImageChecks
from value_types.devices import Device

FAILED = "failed"
REFUSED = "refused"
DIGEST_MISMATCH = "digest_mismatch"
"""An image whose bytes are not the ones its configuration pins: refused, never loaded, and
the device not quarantined (the card was not touched)."""


class ProgrammingRefused(Exception):
    """The device cannot be given the function for this claim; the message says why.

    ``result`` is what the audit and the metric call it (:data:`REFUSED`, :data:`FAILED`,
    :data:`DIGEST_MISMATCH`); ``sha256`` the image's digest where it was taken."""

    def __init__(self, message: str, *, result: str = REFUSED, device_id: str = "",
                 sha256: str | None = None) -> None:
        super().__init__(message)
        self.result = result
        self.device_id = device_id
        self.sha256 = sha256


class Vetting:
    """The checks of one driver's images (``checks`` None: no library configured)."""

    def __init__(self, checks: ImageChecks | None, driver: str,
                 require_digest: bool = False) -> None:
        self.checks = checks
        self.driver = driver
        self.require_digest = require_digest
        """``--require-image-digest``: a function from an image must pin its sha256."""

    def check_image(self, device: Device, spec: FunctionSpec) -> None:
        if device.backend != spec.family:
            raise self.refuse(device, spec, f"the configuration names {spec.field}, a "
                              f"function of the {spec.family} family, for a "
                              f"{device.backend} device")
        if self.checks is not None:
            try:
                self.checks.check(spec, device)
            except ValueError as exc:
                raise self.refuse(device, spec, str(exc)) from None
        elif spec.image is not None:
            raise self.refuse(device, spec, "no image library is configured "
                              "(--image-library)")

    async def check_digest(self, device: Device, spec: FunctionSpec) -> str | None:
        """The image's digest where one is pinned (cached per file version: one ``stat``
        on the fast path); refused when it is not the pinned one, or when this node
        requires a pin and the configuration has none."""
        if spec.image is None or self.checks is None:
            return None
        if spec.sha256 is None:
            if self.require_digest:
                raise self.refuse(device, spec, f"its configuration does not pin image "
                                  f"{spec.image} with sha256, and this node requires one "
                                  "(--require-image-digest)")
            return None
        try:
            return await self.checks.check_digest(spec)
        except DigestMismatch as exc:
            raise self.refuse(device, spec, str(exc), result=DIGEST_MISMATCH,
                              sha256=exc.actual) from None
        except ValueError as exc:
            raise self.refuse(device, spec, str(exc)) from None

    async def digest_to_load(self, device: Device, spec: FunctionSpec) -> str | None:
        """The digest the loader must find in the bytes it loads: the pinned one, checked,
        or the file's own when nothing is pinned (hashed once per file version), so what the
        audit records is what reached the card; None for a function with no image."""
        digest = await self.check_digest(device, spec)
        if digest is not None or spec.image is None or self.checks is None:
            return digest
        try:
            return await self.checks.digest(spec.image)
        except ValueError as exc:
            raise self.refuse(device, spec, str(exc)) from None

    def refuse(self, device: Device, spec: FunctionSpec, why: str, *,
               result: str = REFUSED, sha256: str | None = None) -> ProgrammingRefused:
        metrics.dra_programming(self.driver, device.backend, "", result, 0.0)
        return ProgrammingRefused(f"device {device.id} cannot be given {spec.shown()} "
                                  f"({spec.where}): {why}", result=result,
                                  device_id=device.id, sha256=sha256)

