"""The ``--config`` file's format: a YAML mapping of flag names to values, as a ConfigMap holds.

This module only reads the file's shape (which keys, which values, on which lines); what a
key means and whether its value is good is decided by the flag's own converter, in
:mod:`plugin.cli.sources`. The file is composed with PyYAML's base loader, which resolves no
types: every value reaches that converter as the text it was written as, exactly as a
command-line flag or an ``ACCELERATOR_DP_*`` variable does. So ``cdi: yes`` and
``metrics-port: 8080`` mean what ``--cdi yes`` and ``--metrics-port 8080`` mean, and YAML
1.1's implicit types (``no`` read as false, ``010`` as octal, ``1:30`` as sexagesimal) never
turn a value into something its flag would not have taken. Composing builds no Python
objects from tags, so the file cannot make the process construct anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml


@dataclass(frozen=True)
class Entry:
    """One ``key: value`` of the file: a value is one text, or a tuple of them for a list."""

    key: str
    value: str | tuple[str, ...]
    line: int
    """1-based, as editors count."""


class ConfigFileError(Exception):
    """A file that cannot be used, said in one line naming the file, the line and the key."""

    def __init__(self, path: Path, reason: str, *, line: int | None = None,
                 key: str | None = None) -> None:
        where = f"config file {path}"
        if line is not None:
            where += f", line {line}"
        if key is not None:
            where += f", key {key!r}"
        super().__init__(f"{where}: {reason}")


def read(path: Path) -> dict[str, Entry]:
    """The file's entries by key; :class:`ConfigFileError` for anything but such a mapping.

    An empty file, or one of comments only, holds no settings (a ConfigMap may be created
    before anything is put in it).
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigFileError(path, f"cannot read it: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigFileError(path, "cannot read it: not UTF-8 text") from None
    try:
        root = yaml.compose(text, Loader=yaml.BaseLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise ConfigFileError(path, f"malformed YAML: {_one_line(exc)}",
                              line=None if mark is None else mark.line + 1) from None
    except yaml.YAMLError as exc:
        raise ConfigFileError(path, f"malformed YAML: {_one_line(exc)}") from None
    if root is None:
        return {}
    if not isinstance(root, yaml.MappingNode):
        raise ConfigFileError(path, "expected a mapping of flag names to values, found "
                              f"{_kind(root)}", line=root.start_mark.line + 1)
    entries: dict[str, Entry] = {}
    for key_node, value_node in root.value:
        line = key_node.start_mark.line + 1
        if not isinstance(key_node, yaml.ScalarNode):
            raise ConfigFileError(path, f"a key must be a flag name, not {_kind(key_node)}",
                                  line=line)
        key = key_node.value
        if key in entries:
            raise ConfigFileError(path, f"given twice (first on line {entries[key].line})",
                                  line=line, key=key)
        entries[key] = Entry(key, _value(path, key, value_node), line)
    return entries


def _value(path: Path, key: str, node: yaml.Node) -> str | tuple[str, ...]:
    if isinstance(node, yaml.ScalarNode):
        return str(node.value)
    if isinstance(node, yaml.SequenceNode) and all(
            isinstance(item, yaml.ScalarNode) for item in node.value):
        return tuple(str(item.value) for item in node.value)
    raise ConfigFileError(path, f"expected a value or a list of values, found {_kind(node)}",
                          line=node.start_mark.line + 1, key=key)


def _kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return f"the value {node.value!r}"


def _one_line(exc: yaml.YAMLError) -> str:
    """PyYAML's message without the quoted snippet it spreads over several lines."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem:
        return f"{exc.problem} ({exc.context})" if exc.context else exc.problem
    return " ".join(str(exc).split())
