"""The node's image library: the only files a claim may name, read no further than needed.

A claim (or its DeviceClass) names an image by a path relative to the library root, a
read-only hostPath the admin fills. Whoever writes a claim must not be able to make the
driver read anything else on the node, so a name is refused when it is absolute, has a
``..`` component, or resolves (through any symlink) outside the root; and a file over the
size bound or that is not a regular file is refused before it is parsed. Containment is
checked twice: on the resolved path before opening, and on the path the opened descriptor
really has (``/proc/self/fd``), so a directory swapped for a symlink in between is caught.

Parsing reads only the header: a GBS's 20-byte prefix and JSON metadata, an xclbin's
456-byte header and section table. A multi-hundred-MB bitstream is never loaded to learn
which function it holds.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO, TypeVar

from plugin.model.programming import DEFAULT_MAX_IMAGE_BYTES
from plugin.programming.gbs import GbsImage, read_gbs
from plugin.programming.xclbin import XclbinImage, read_xclbin

DEFAULT_MAX_BYTES = DEFAULT_MAX_IMAGE_BYTES
_T = TypeVar("_T")


@dataclass(frozen=True)
class ImageLibrary:
    """Image files under ``root``, each at most ``max_bytes`` long."""

    root: Path
    max_bytes: int = DEFAULT_MAX_BYTES

    def resolve(self, name: str) -> Path:
        """The real path of image ``name``; ValueError naming the problem if it may not be read."""
        _check_name(name)
        root = self._root()
        candidate = root / name
        try:
            real = candidate.resolve(strict=True)
        except FileNotFoundError:
            raise ValueError(f"image {name!r} is not in the image library {root}") from None
        except (OSError, RuntimeError) as exc:
            raise ValueError(f"image {name!r} cannot be resolved: {exc}") from None
        if real == root or not real.is_relative_to(root):
            raise ValueError(f"image {name!r} resolves to {real}, outside the image "
                             f"library {root}")
        return real

    @contextmanager
    def open(self, name: str) -> Iterator[tuple[BinaryIO, int]]:
        """The image open for reading, with its size, once every rule above holds."""
        real = self.resolve(name)
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        try:
            fd = os.open(real, flags)
        except OSError as exc:
            raise ValueError(f"image {name!r} cannot be opened: {exc.strerror}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise ValueError(f"image {name!r} is not a regular file")
            if info.st_size > self.max_bytes:
                raise ValueError(f"image {name!r} is {info.st_size} bytes, over the "
                                 f"{self.max_bytes}-byte bound")
            self._check_opened(name, fd)
            stream = os.fdopen(fd, "rb", buffering=0)
        except BaseException:
            os.close(fd)
            raise
        with stream:
            yield stream, info.st_size

    def read_gbs(self, name: str) -> GbsImage:
        """The GBS ``name``'s header and metadata; ValueError naming the image and problem."""
        return self._read(name, read_gbs)

    def read_xclbin(self, name: str) -> XclbinImage:
        """The xclbin ``name``'s header and sections; ValueError naming the image and problem."""
        return self._read(name, read_xclbin)

    def _read(self, name: str, reader: Callable[[BinaryIO, int], _T]) -> _T:
        with self.open(name) as (stream, size):
            try:
                return reader(stream, size)
            except ValueError as exc:
                raise ValueError(f"image {name!r}: {exc}") from None
            except OSError as exc:
                raise ValueError(f"image {name!r} cannot be read: {exc.strerror}") from None

    def _root(self) -> Path:
        try:
            root = self.root.resolve(strict=True)
        except (OSError, RuntimeError) as exc:
            raise ValueError(f"image library {self.root} is unavailable: {exc}") from None
        if not root.is_dir():
            raise ValueError(f"image library {self.root} is not a directory")
        return root

    def _check_opened(self, name: str, fd: int) -> None:
        link = Path(f"/proc/self/fd/{fd}")
        try:
            opened = Path(os.readlink(link))
        except OSError:
            return  # no /proc: the check on the resolved path stands alone
        root = self._root()
        if not opened.is_relative_to(root):
            raise ValueError(f"image {name!r} opened as {opened}, outside the image "
                             f"library {root} (the tree changed while it was opened)")


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError("image name is empty or not a string")
    if "\0" in name:
        raise ValueError(f"image name {name!r} contains a NUL byte")
    path = PurePosixPath(name)
    if path.is_absolute():
        raise ValueError(f"image name {name!r} is absolute; names are relative to the "
                         f"image library")
    if ".." in path.parts:
        raise ValueError(f"image name {name!r} has a '..' component")
