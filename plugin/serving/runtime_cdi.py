"""Whether a node's container runtime applies CDI, judged from what its kubelet reports.

DRA hands devices to containers only through CDI: the kubelet passes the CDI device names of
a prepared claim to the runtime, and a runtime that does not apply CDI starts the container
without the devices (and without the claim spec's ``ACCELERATOR_UNITS``), telling no one. The
runtime and its version are in the Node's ``status.nodeInfo.containerRuntimeVersion``, which
the kubelet fills from the CRI ``Version`` call as ``<runtime name>://<version>``
(``containerd://1.6.20``, ``cri-o://1.22.1``). What each version does:

====================  ==========================================================================
runtime               CDI
====================  ==========================================================================
containerd < 1.7      no: CDI arrived in containerd 1.7.0
containerd 1.7.x      only with ``enable_cdi = true`` in the CRI plugin's configuration, off by
                      default (containerd ``docs/cri/config.md`` of release/1.7: "enable_cdi
                      enables support of the Container Device Interface (CDI)", default
                      ``false``); the version cannot tell, so no unless declared
containerd >= 2.0     yes: ``enable_cdi`` defaults to true from 2.0 (``RELEASES.md`` lists the
                      option as deprecated in 2.2, CDI then always on); an admin who turned it
                      off declares ``disabled``
CRI-O < 1.23          no
CRI-O >= 1.23         yes: CDI support is in CRI-O from 1.23.0, on by default (the CDI
                      project's README, "How to configure CDI?")
anything else         cannot tell (cri-dockerd's ``docker://``, a ``remote://`` shim, an empty
                      or unparsable string): no unless declared
====================  ==========================================================================

``--runtime-cdi`` declares what the version alone cannot tell: ``enabled`` for a containerd
1.7 with ``enable_cdi = true`` or another runtime known to apply CDI, ``disabled`` for a
runtime whose CDI is turned off. ``disabled`` always wins (fail safe); ``enabled`` never
makes a runtime that has no CDI at all (containerd < 1.7, CRI-O < 1.23) apply it. This module
is the pure rule; :mod:`plugin.process.dra_side` reads the Node and acts on the verdict.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

AUTO = "auto"
ENABLED = "enabled"
DISABLED = "disabled"
CHOICES = (AUTO, ENABLED, DISABLED)

CONDITION = "RuntimeAppliesCDI"
"""The condition every prepared device of a claim gets where the runtime may not apply CDI."""

_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?")
"""The release at the start of a version (``1.7.2``, ``v1.7.2``, ``1.6.20~ds1``, ``2.0.0-rc.1``)."""


@dataclass(frozen=True)
class RuntimeVersion:
    """``containerRuntimeVersion`` taken apart: the runtime's name (lower case) and its
    release, None where the text holds none."""

    name: str
    release: tuple[int, int, int] | None
    text: str


def parse(text: str | None) -> RuntimeVersion:
    """``containerd://1.6.20`` -> ("containerd", (1, 6, 20)); never raises."""
    text = (text or "").strip()
    name, sep, version = text.partition("://")
    if not sep:
        name, version = "", text
    found = _VERSION.match(version.strip())
    release = None if found is None else (
        int(found.group(1)), int(found.group(2)), int(found.group(3) or 0))
    return RuntimeVersion(name.strip().lower(), release, text)


@dataclass(frozen=True)
class Verdict:
    """Whether the runtime applies CDI: True, False, or None (cannot tell, and not declared),
    with why in words a log line and an Event can carry."""

    applies: bool | None
    why: str
    read: bool = True
    """False where the Node could not be read (no runtime reported at all)."""

    @property
    def condition(self) -> tuple[str, str, str]:
        """(status, reason, message) of :data:`CONDITION` for a device under this runtime."""
        if self.applies:
            return "True", "RuntimeAppliesCDI", self.why
        status, reason = ("False", "RuntimeWithoutCDI") if self.applies is False \
            else ("Unknown", "RuntimeCDIUnknown")
        return status, reason, (f"{self.why}: the container may start without this device "
                                "(its device nodes and environment come through CDI)")


def judge(reported: str | None, declared: str = AUTO) -> Verdict:
    """The verdict for the runtime the Node reports (None: the Node could not be read)."""
    if reported is None:
        said = "the Node's status.nodeInfo.containerRuntimeVersion could not be read"
        if declared == ENABLED:
            return Verdict(True, f"{said}; --runtime-cdi enabled declares that its runtime "
                                 "applies CDI", read=False)
        return replace(_undeclared(None, said, declared), read=False)
    runtime = parse(reported)
    shown = f"runtime {runtime.text or '(none reported)'}"
    never = _never(runtime)
    if never is not None:
        ignored = " (--runtime-cdi enabled cannot change that)" if declared == ENABLED else ""
        return Verdict(False, f"{shown} does not apply CDI ({never}){ignored}")
    if declared == DISABLED:
        return Verdict(False, f"{shown}: --runtime-cdi disabled declares that it does not "
                              "apply CDI")
    if declared == ENABLED:
        return Verdict(True, f"{shown}: --runtime-cdi enabled declares that it applies CDI")
    release = runtime.release
    if runtime.name == "containerd" and release is not None:
        if release[0] >= 2:
            return Verdict(True, f"{shown} applies CDI (containerd 2.0 and later: on by "
                                 "default)")
        return Verdict(None, f"{shown} applies CDI only with enable_cdi = true in its CRI "
                             "plugin configuration (off by default in containerd 1.7); set "
                             "--runtime-cdi enabled once it is")
    if runtime.name == "cri-o" and release is not None:
        return Verdict(True, f"{shown} applies CDI (CRI-O 1.23 and later)")
    return _undeclared(runtime, shown, declared)


def _never(runtime: RuntimeVersion) -> str | None:
    """Why a runtime cannot apply CDI whatever its configuration; None where it can."""
    release = runtime.release
    if release is None:
        return None
    if runtime.name == "containerd" and release[:2] < (1, 7):
        return "containerd < 1.7"
    if runtime.name == "cri-o" and release[:2] < (1, 23):
        return "CRI-O < 1.23"
    return None


def _undeclared(runtime: RuntimeVersion | None, shown: str, declared: str) -> Verdict:
    if declared == DISABLED:
        return Verdict(False, f"{shown}: --runtime-cdi disabled declares that it does not "
                              "apply CDI")
    if runtime is None:
        what = "whether its runtime applies CDI"
    elif runtime.name in ("containerd", "cri-o"):
        what = "which release this is, so whether it applies CDI"
    else:
        what = "whether an unknown runtime applies CDI"
    return Verdict(None, f"{shown}: cannot tell {what}; set --runtime-cdi enabled if it does")
