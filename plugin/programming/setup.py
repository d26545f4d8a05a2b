"""The loaders and the programmer ``--programming`` and its flags ask for, built in one place.

``serve`` (the DRA driver) and ``discover`` both ask here which devices are programmable, so
the ``programmable`` attribute a selector reads and the column ``discover`` prints can never
disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from plugin.cli.config import Settings
from plugin.model.programming import WhyNot, never_why
from plugin.programming.image_checks import ImageChecks, held_function
from plugin.programming.library import ImageLibrary
from plugin.programming.loaders.base import Loader, LoadFailed
from value_types.devices import Device, DeviceSet

if TYPE_CHECKING:  # the driver's: imported where used, so the loader process never holds them
    from plugin.programming.load_record import LoadRecord
    from plugin.programming.loaders.card_locked import CardLockedLoader
    from plugin.programming.programmer import Programmer, Told
    from plugin.programming.quarantine import Quarantine


def loaders_for(settings: Settings) -> dict[str, Loader]:
    """Family -> the loader the flags choose for it: for ``serve --loader-socket`` (and
    ``discover`` given the same socket, so its PROGRAMMABLE column is the driver's rule),
    stand-ins forwarding to the loader process (:mod:`plugin.programming.remote`);
    otherwise, and in the ``loader`` process itself, the loaders that load, each load under
    its card's lock in the driver's state directory, recorded there before it starts
    (:mod:`plugin.programming.loaders.card_locked`): whichever process loads, one card is
    loaded by one process at a time on the node."""
    if settings.command in ("serve", "discover") and settings.loader_socket is not None:
        from plugin.programming.remote.client import remote_loaders

        return dict(remote_loaders(settings.loader_socket))
    return dict(local_loaders(settings))


def local_loaders(settings: Settings) -> dict[str, CardLockedLoader]:
    """Family -> the loader that loads from this process, as the flags choose it, each load
    under its card's lock (see :func:`loaders_for`); the ``loader`` process calls their
    blocking cores."""
    from plugin.cli.settings import dra_state_dir
    from plugin.programming.card_state import CardFiles
    from plugin.programming.loaders.card_locked import CardLockedLoader
    from plugin.programming.loaders.choose import loaders

    files = CardFiles(dra_state_dir(settings))
    chosen = loaders(intel=settings.intel_loader, dev_root=settings.dev_root,
                     fpgaconf=settings.fpgaconf, xbutil=settings.xbutil,
                     aws_load=settings.fpga_load_local_image,
                     aws_describe=settings.fpga_describe_local_image)
    return {family: CardLockedLoader(loader, files) for family, loader in chosen.items()}


def why_not_programmable(settings: Settings) -> WhyNot:
    """What ``discover`` shows as PROGRAMMABLE: the rule the driver publishes."""
    from plugin.programming.programmer import unavailable

    if settings.programming != "on":
        return never_why
    loaders = loaders_for(settings)
    return lambda device: unavailable(device, True, loaders)


def programmer_for(settings: Settings, quarantine: Quarantine,
                   devices: Callable[[], DeviceSet], rescan: Callable[[str], None],
                   told: Told | None = None,
                   loaders: Mapping[str, Loader] | None = None) -> Programmer:
    """The DRA driver's programmer; ``loaders`` replaces the flags' choice (tests)."""
    from plugin.programming.load_record import LoadRecords
    from plugin.programming.programmer import Programmer

    enabled = settings.programming == "on"
    chosen = dict(loaders) if loaders is not None else (loaders_for(settings) if enabled
                                                          else {})
    checks = ImageChecks(ImageLibrary(Path(settings.image_library), settings.image_max_bytes))
    return Programmer(enabled=enabled, loaders=chosen, checks=checks, quarantine=quarantine,
                      devices=devices, rescan=rescan, driver=settings.dra_driver_name,
                      timeout=settings.program_timeout, told=told,
                      require_digest=settings.require_image_digest,
                      records=LoadRecords(quarantine.state_dir))


async def functions_only_tools_tell(settings: Settings, devices: Iterable[Device]
                                    ) -> dict[str, str]:
    """Device ID -> the function its loader reads (AWS slots: the SDK's describe), for
    ``discover``; only with programming on (the tools' paths are then meant), and only
    for devices whose function sysfs does not show. A tool that fails says nothing."""
    if settings.programming != "on":
        return {}
    loaders = loaders_for(settings)
    found = {}
    for device in devices:
        loader = loaders.get(device.backend)
        if held_function(device) is not None or loader is None or \
                loader.unavailable(device) is not None:
            continue
        try:
            function = await loader.loaded(device)
        except LoadFailed:
            continue
        if function:
            found[device.id] = function
    return found


def loaded_from(settings: Settings, devices: Iterable[Device],
                told: Mapping[str, str]) -> dict[str, LoadRecord]:
    """Device ID -> the driver's record of its last load, for ``discover``: only where the
    device still holds the recorded function (``told``: what only a tool can tell)."""
    from plugin.cli.settings import dra_state_dir
    from plugin.programming.load_record import read_records

    records = read_records(dra_state_dir(settings))
    shown = {}
    for device in devices:
        record = records.get(device.id)
        held = held_function(device) or told.get(device.id)
        if record is not None and held == record.function_id:
            shown[device.id] = record
    return shown
