"""The random-damage harness shared by the discovery tests of every backend.

A test builds a tree, picks paths by index from :func:`entries` with :func:`damage_lists`,
breaks them with :func:`apply` and scans with the backend's logs :func:`captured`.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

ID = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7](-port\d+)?$")
KINDS = ("garbage", "empty", "huge", "binary", "delete", "to_dir", "to_file", "dangling",
         "self_loop", "fifo", "rename")
FAST_TMP = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
"""Trees are built for every example; a memory file system keeps that cheap where there is one."""

Damage = tuple[int, str, bytes]


def entries(root: Path) -> list[Path]:
    found = []
    for directory, dirs, files in os.walk(root):
        found += [Path(directory) / n for n in sorted(dirs) + sorted(files)]
    return sorted(found)



def corrupt(path: Path, kind: str, salt: bytes) -> None:
    if not os.path.lexists(path):
        return
    if kind == "rename":
        target = path.with_name("garbage-" + salt.hex()[:6])
        while os.path.lexists(target):  # two renames with the same salt in one directory
            target = target.with_name(target.name + "x")
        path.rename(target)
        return
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()
    if kind == "garbage":
        path.write_bytes(b"zz" + salt + b"\n")
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "huge":
        path.write_bytes(b"0" * 9000)
    elif kind == "binary":
        path.write_bytes(b"\xff\xfe\x00" + salt)
    elif kind == "to_dir":
        path.mkdir()
    elif kind == "to_file":
        path.write_text("0x0\n")
    elif kind == "dangling":
        os.symlink("nowhere-" + salt.hex()[:4], path)
    elif kind == "self_loop":
        os.symlink(path.name, path)
    elif kind == "fifo":
        os.mkfifo(path)



def touched(footprint: list[Path], damaged: list[Path]) -> bool:
    return any(p == d or d in p.parents or p in d.parents for p in footprint for d in damaged)



def damage_lists(build: Callable[[Path], Any]) -> st.SearchStrategy[list[Damage]]:
    """One to four (path index, kind, salt) damages over the entries of a ``build`` tree."""
    with tempfile.TemporaryDirectory() as template:
        build(Path(template))
        size = len(entries(Path(template)))
    return st.lists(st.tuples(st.integers(0, size - 1), st.sampled_from(KINDS),
                              st.binary(max_size=8)), min_size=1, max_size=4)


def apply(root: Path, damages: list[Damage]) -> list[Path]:
    """Break the entries of ``root`` that ``damages`` pick; the paths damaged."""
    paths = entries(root)
    damaged = [paths[i] for i, _, _ in damages if i < len(paths)]
    for index, kind, salt in damages:
        if index < len(paths):
            corrupt(paths[index], kind, salt)
    return damaged


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def captured() -> Iterator[Records]:
    handler = Records()
    logger = logging.getLogger("plugin.discovery.backends")
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)

