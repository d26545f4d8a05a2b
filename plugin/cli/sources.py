"""Where each setting comes from, and the record of it the start-up line and ``discover`` show.

A setting is taken from the command line, else its ``ACCELERATOR_DP_*`` variable, else the
``--config`` file, else its default. Every option is registered once, as an :class:`Option`
holding the converter and choices its flag uses, so a variable and a file entry are checked
by exactly what checks the flag: the three ways of setting a value accept the same text and
refuse it with the same words. argparse only ever sees :data:`UNSET` as a default, which is
how a flag given on the command line is told from one that was not, even when it repeats
the default.

Nothing here names a flag: a flag registered through ``_EnvDefaults`` in
:mod:`plugin.cli.config` is settable from the environment and the file with no change here.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONFIG_KEY = "config"
"""The option naming the file; the one key a file cannot hold."""


class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


UNSET: Any = _Unset()
"""argparse's default for every registered option: "not given on the command line"."""


class SettingError(Exception):
    """A variable, file or default that does not convert, in one line."""


@dataclass(frozen=True)
class Option:
    """One setting: its flag's name as a file key, its variable, converter and default."""

    key: str
    """The flag's name without its leading dashes, as the file spells it."""
    dest: str
    variable: str
    default: Any
    convert: Callable[[str], Any]
    choices: Sequence[Any] | None = None

    @property
    def takes_list(self) -> bool:
        """A setting whose default is a tuple is a list, which a file may write as one."""
        return isinstance(self.default, tuple)

    def parse(self, text: str) -> Any:
        """``text`` as the flag takes it; :class:`ValueError` saying why not otherwise."""
        try:
            value = self.convert(text)
        except (argparse.ArgumentTypeError, ValueError) as exc:
            raise ValueError(str(exc)) from None
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"{text!r} is not one of {', '.join(map(str, self.choices))}")
        return value


@dataclass(frozen=True)
class Origin:
    """A setting that did not come from its default, and where it came from."""

    key: str
    value: Any
    source: str
    """``flag``, ``env ACCELERATOR_DP_X`` or ``file /path (key)``."""

    def __str__(self) -> str:
        return f"{self.key}={shown(self.value)} [{self.source}]"


def shown(value: Any) -> str:
    """A value as it would be written on the command line."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


def describe(origins: Sequence[Origin]) -> str:
    """One line for the log: each setting not at its default, and where it came from."""
    if not origins:
        return "every setting at its default"
    return "settings: " + ", ".join(map(str, origins))


def resolve(ns: argparse.Namespace, options: Sequence[Option],
            file_options: Mapping[str, Option], file_commands: Sequence[str],
            environ: Mapping[str, str]) -> tuple[Origin, ...]:
    """Set every option of ``ns`` still :data:`UNSET`; return where the others came from.

    ``options`` are the running subcommand's; ``file_options`` every option of the
    subcommands that read a file (``file_commands``), by key. One file serves them all: a key
    only another of them has is checked but not applied; a key none has is an error, as is
    any bad value, even one a flag or variable overrides, so a mistake surfaces wherever the
    file is read.
    """
    by_key = {o.key: o for o in options}
    config = by_key.get(CONFIG_KEY)
    found: dict[str, Origin] = {}
    path: Path | None = None
    entries: dict[str, Any] = {}
    if config is not None:
        found |= _settle(ns, config, environ, None, entries)
        path = getattr(ns, config.dest)
        if path is not None:
            entries = _read_file(path, {**file_options, **by_key}, file_commands)
    for option in options:
        if option is not config:
            found |= _settle(ns, option, environ, path, entries)
    return tuple(found[o.key] for o in options if o.key in found)


def _settle(ns: argparse.Namespace, option: Option, environ: Mapping[str, str],
            path: Path | None, entries: Mapping[str, Any]) -> dict[str, Origin]:
    value = getattr(ns, option.dest, UNSET)
    if value is not UNSET:
        return {option.key: Origin(option.key, value, "flag")}
    raw = environ.get(option.variable)
    if raw is not None:
        try:
            value = option.parse(raw)
        except ValueError as exc:
            raise SettingError(f"environment variable {option.variable}: {exc}") from None
        setattr(ns, option.dest, value)
        return {option.key: Origin(option.key, value, f"env {option.variable}")}
    if option.key in entries:
        value = entries[option.key]
        setattr(ns, option.dest, value)
        return {option.key: Origin(option.key, value, f"file {path} ({option.key})")}
    value = option.default
    if isinstance(value, str):
        # What argparse does with a text default (--node-name's comes from $NODE_NAME).
        try:
            value = option.convert(value)
        except (argparse.ArgumentTypeError, ValueError) as exc:
            raise SettingError(f"argument --{option.key}: {exc}") from None
    setattr(ns, option.dest, value)
    return {}


def _read_file(path: Path, options: Mapping[str, Option],
               commands: Sequence[str]) -> dict[str, Any]:
    """Every entry of the file, converted by its flag's converter; keys none has refused."""
    from plugin.cli.config_file import ConfigFileError, read

    values: dict[str, Any] = {}
    try:
        for key, entry in read(path).items():
            option = options.get(key)
            if key == CONFIG_KEY:
                raise ConfigFileError(path, "a config file cannot name another one; give "
                                      "--config or ACCELERATOR_DP_CONFIG", line=entry.line,
                                      key=key)
            if option is None:
                raise ConfigFileError(path, _unknown(key, options, commands),
                                      line=entry.line, key=key)
            if isinstance(entry.value, tuple) and not option.takes_list:
                raise ConfigFileError(path, "takes one value, not a list", line=entry.line,
                                      key=key)
            text = ",".join(entry.value) if isinstance(entry.value, tuple) else entry.value
            try:
                values[key] = option.parse(text)
            except ValueError as exc:
                raise ConfigFileError(path, str(exc), line=entry.line, key=key) from None
    except ConfigFileError as exc:
        raise SettingError(str(exc)) from None
    return values


def _unknown(key: str, options: Mapping[str, Option], commands: Sequence[str]) -> str:
    import difflib  # here: only a mistyped key needs it, and every process parses flags

    reason = f"not a setting of {' or '.join(commands)}"
    near = difflib.get_close_matches(key.lstrip("-").replace("_", "-").lower(),
                                     [k for k in options if k != CONFIG_KEY], n=1,
                                     cutoff=0.75)
    return f"{reason} (did you mean {near[0]!r}?)" if near else reason
