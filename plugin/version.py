"""The one version this build reports, read from the installed package's metadata.

``pyproject.toml`` holds the version and nothing else repeats it: ``--version``, the
start-up log line, the ``build_info`` metric and the image's labels all come from here (the
image passes it as a build argument), so a release tag that disagrees with the package is
caught by the release workflow rather than shipped.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "k8s-accelerator-devplugin"


def _installed_version() -> str:
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        # Run from a source tree that was never installed (no metadata): say so rather
        # than invent a number.
        return "0+unknown"


VERSION = _installed_version()
