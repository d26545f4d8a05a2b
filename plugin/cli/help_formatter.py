"""argparse's help formatter, told the terminal's width without :mod:`shutil`."""

from __future__ import annotations

import argparse
import os
import sys


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, told the terminal's width without :mod:`shutil`.

    argparse builds a formatter for every flag it adds (to check the flag's metavar), and
    each asks ``shutil.get_terminal_size``: importing shutil maps zlib, bz2 and lzma, 0.6 MiB
    of native code in every process, the privileged loader's included, that no command uses.
    The width is read as shutil reads it: ``COLUMNS``, else the terminal on stdout, else 80.
    """

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        super().__init__(prog, indent_increment, max_help_position,
                         width if width is not None else _columns() - 2)


def _columns() -> int:
    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80
