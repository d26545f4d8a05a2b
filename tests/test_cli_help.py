"""``--help`` reads as argparse's own, at the terminal's width, without importing shutil."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from plugin.cli.config import build_parser


@pytest.mark.parametrize("columns", ["50", "200", None])
@pytest.mark.parametrize("command", [None, "serve", "discover", "loader", "healthcheck"])
def test_help_is_what_argparse_prints(monkeypatch: pytest.MonkeyPatch, columns: str | None,
                                      command: str | None) -> None:
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    parser = build_parser()
    shown = parser.commands[command] if command else parser
    ours = shown.format_help()
    shown.formatter_class = argparse.HelpFormatter
    assert ours == shown.format_help()


def test_a_wider_terminal_gets_wider_help() -> None:
    def widest(columns: str) -> int:
        shown = subprocess.run([sys.executable, "-m", "plugin", "serve", "--help"],
                               capture_output=True, text=True, check=True, timeout=60,
                               env={"PATH": "/usr/bin:/bin", "COLUMNS": columns}).stdout
        return max(len(line) for line in shown.splitlines())

    assert widest("200") > 150 > 100 > widest("80")


def test_parsing_flags_imports_no_shutil() -> None:
    """shutil maps zlib, bz2 and lzma: no command needs them, the privileged loader least."""
    probe = ("import sys; from plugin.cli.config import parse; "
             "parse(['loader', '--loader-socket', '/tmp/x.sock']); "
             "print(sorted({'shutil', 'lzma', 'bz2'} & set(sys.modules)))")
    shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           check=True, timeout=60)
    assert shown.stdout.strip() == "[]", shown.stderr
