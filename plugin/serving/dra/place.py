"""Where one node's DRA driver lives: its names, directories and the settings it is built
with, kept apart from :mod:`.driver`, which puts the driver together from them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from plugin.programming.guarded import GrantsSource
from plugin.serving.dra.apiserver import REQUEST_TIMEOUT
from plugin.serving.dra.stopping import DEFAULT_STOP_TIMEOUT


@dataclass(frozen=True)
class DriverPlace:
    """Where one node's driver lives: its names and its directories."""

    driver: str
    node: str
    registry_dir: Path
    state_dir: Path
    cdi_dir: Path
    kubeconfig: Path | None = None
    request_timeout: float = REQUEST_TIMEOUT
    """``--api-request-timeout``: how long one API server call may take."""
    chosen_per_kubelet: bool = False
    """``--api auto``: a kubelet refusing the driver is one of the expected answers."""
    kubelet_socket: Path | None = None
    """The device-plugin ``kubelet.sock``, which every kubelet start makes anew: what tells
    one kubelet instance from the next (``--api auto``)."""
    stop_timeout: float = DEFAULT_STOP_TIMEOUT
    """``--stop-timeout``: how long a stop waits for the loads and clears under way."""
    pod_resources_socket: Path | None = None
    """The kubelet's PodResources socket: devices containers still hold through the device
    plugin are published tainted, and prepared for no claim, until released (None: not
    asked, every device offered)."""
    grants: GrantsSource | None = None  # --function-grants (None: nothing guarded)
    program_at: str = "prepare"
    """``--program-at``: ``bind`` loads functions before pods bind (:mod:`.binding`)."""
