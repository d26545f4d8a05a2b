"""Fixtures shared by the emulator tests and the compatibility matrix."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def sockdir() -> Iterator[Path]:
    """A short device-plugin directory: unix socket paths must stay under 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix="dp", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
