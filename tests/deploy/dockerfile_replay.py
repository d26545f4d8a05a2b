"""Read Dockerfile.multistage and .dockerignore, and replay their steps on this machine.

There is no container engine here, so the image is proven by construction: the test runs the
very COPY and RUN lines of each stage, in order, inside a scratch directory that stands for
the image's root filesystem. Absolute paths that the Dockerfile names through ARG values and
WORKDIR are moved under that directory; everything else (the shell commands themselves) runs
verbatim with ``sh -c``, with ``python`` on PATH being this machine's base Python 3.11, the
same minor version as the Dockerfile's python:3.11 image.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_VARIABLE = re.compile(rf"\$(?:\{{(?P<braced>{_NAME})\}}|(?P<plain>{_NAME}))")


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str
    line: int


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[Instruction] = field(default_factory=list)


def instructions(text: str) -> list[Instruction]:
    """Instructions of a Dockerfile: comments dropped, backslash continuations joined."""
    result: list[Instruction] = []
    pending = ""
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        pending += stripped
        keyword, _, arguments = pending.partition(" ")
        result.append(Instruction(keyword.upper(), arguments.strip(), start))
        pending = ""
    if pending:
        raise ValueError(f"line {start}: continuation runs past the end of the file")
    return result


def substitute(text: str, variables: dict[str, str]) -> str:
    """Docker's ``$VAR``/``${VAR}`` expansion in non-RUN instructions (unknown names: empty)."""
    return _VARIABLE.sub(lambda m: variables.get(m["braced"] or m["plain"], ""), text)


def _assignments(arguments: str) -> dict[str, str]:
    """``ARG NAME=value`` and ``ENV A=1 B="2"`` (the key=value forms only)."""
    values = {}
    for word in shlex.split(arguments):
        name, sep, value = word.partition("=")
        values[name] = value if sep else ""
    return values


def stages(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults (before the first FROM) and the stages, bases substituted."""
    global_args: dict[str, str] = {}
    result: list[Stage] = []
    for item in instructions(text):
        if item.keyword == "FROM":
            words = item.arguments.split()
            base = substitute(words[0], global_args)
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else str(len(result))
            result.append(Stage(name, base))
        elif not result:
            if item.keyword != "ARG":
                raise ValueError(f"line {item.line}: only ARG may come before FROM")
            global_args.update(_assignments(item.arguments))
        else:
            result[-1].instructions.append(item)
    return global_args, result


# --- .dockerignore ------------------------------------------------------------------------


@dataclass(frozen=True)
class IgnoreRule:
    parts: tuple[str, ...]
    negated: bool


def ignore_rules(text: str) -> list[IgnoreRule]:
    rules = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = os.path.normpath(line.removeprefix("!").strip()).lstrip("/")
        rules.append(IgnoreRule(tuple(pattern.split("/")), negated))
    return rules


def _match(pattern: tuple[str, ...], path: tuple[str, ...]) -> bool:
    if not pattern:
        return not path
    if pattern[0] == "**":
        return any(_match(pattern[1:], path[i:]) for i in range(len(path) + 1))
    return bool(path) and fnmatch.fnmatchcase(path[0], pattern[0]) and _match(pattern[1:], path[1:])


def ignored(rules: list[IgnoreRule], relative: str) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents decides."""
    parts = tuple(PurePosixPath(relative).parts)
    prefixes = [parts[:n] for n in range(1, len(parts) + 1)]
    verdict = False
    for rule in rules:
        if any(_match(rule.parts, prefix) for prefix in prefixes):
            verdict = not rule.negated
    return verdict


def context_files(root: Path, rules: list[IgnoreRule]) -> Iterator[str]:
    """Relative paths of the files ``docker build`` would send from ``root``."""
    exceptions = [r.parts for r in rules if r.negated]
    for directory, subdirs, files in os.walk(root):
        here = Path(directory).relative_to(root)
        kept = []
        for name in sorted(subdirs):
            relative = (here / name).as_posix()
            depth = len(PurePosixPath(relative).parts)
            reopened = any(
                len(parts) > depth or "**" in parts for parts in exceptions
            )
            if not ignored(rules, relative) or reopened:
                kept.append(name)
        subdirs[:] = kept
        for name in sorted(files):
            relative = (here / name).as_posix()
            if not ignored(rules, relative):
                yield relative


# --- replay -------------------------------------------------------------------------------

KNOWN_METADATA = {"LABEL", "HEALTHCHECK", "ENTRYPOINT", "CMD", "EXPOSE", "USER", "STOPSIGNAL"}
# What the official python images set before any line of ours runs.
BASE_IMAGE_ENV = {"PATH": "/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin",
                  "LANG": "C.UTF-8"}


@dataclass
class StageRun:
    """What replaying one stage left: its root, its ARG/ENV values, what it copied in."""

    root: Path
    variables: dict[str, str] = field(default_factory=dict)
    copied_from: list[tuple[str, Path, Path]] = field(default_factory=list)
    log: list[str] = field(default_factory=list)


def replay_stage(stage: Stage, global_args: dict[str, str], root: Path, image_python: Path,
                 context: Path | None = None, files: list[str] | None = None,
                 previous: dict[str, StageRun] | None = None) -> StageRun:
    """Run ``stage`` with ``root`` standing for ``/``.

    ARG values and WORKDIR paths that are absolute are moved under ``root``; RUN commands run
    verbatim with those values in their environment. ``image_python`` must be a throwaway
    virtualenv standing for the base image's interpreter (see :func:`base_image_python`): its
    ``bin`` comes first on PATH, so whatever a RUN line does to ``python`` or ``pip`` lands in
    that venv, never in a Python of this machine. ``COPY .`` copies ``files`` (the filtered
    context); ``COPY --from=S src dst`` requires the source already to sit at the destination,
    because it is the same scratch path for both stages (venvs are not relocatable, and in
    the image the path is the same too).
    """
    if not (image_python / "pyvenv.cfg").exists():
        raise ValueError(f"{image_python} is not a virtualenv: the replay would run RUN lines "
                         "against a real interpreter")
    run = StageRun(root)
    root.mkdir(parents=True, exist_ok=True)
    shims = image_python / "bin"
    args: dict[str, str] = {}
    env: dict[str, str] = {}
    workdir = root
    for item in stage.instructions:
        variables = {**BASE_IMAGE_ENV, **global_args, **args, **env}
        if item.keyword == "ARG":
            for name, value in _assignments(item.arguments).items():
                value = substitute(value, variables) or global_args.get(name, "")
                args[name] = _under(root, value)
        elif item.keyword == "ENV":
            for name, value in _assignments(item.arguments).items():
                env[name] = substitute(value, variables)
        elif item.keyword == "WORKDIR":
            workdir = Path(_under(root, substitute(item.arguments, variables)))
            workdir.mkdir(parents=True, exist_ok=True)
        elif item.keyword == "COPY":
            _copy(run, substitute(item.arguments, variables), workdir, context, files,
                  previous or {})
        elif item.keyword == "RUN":
            _run(run, item, workdir, {**args, **env}, shims)
        elif item.keyword not in KNOWN_METADATA:
            raise ValueError(f"line {item.line}: the replay does not know {item.keyword}")
    run.variables = {**args, **env}
    return run


def base_image_python(base_interpreter: Path, where: Path) -> Path:
    """A fresh venv (with pip and setuptools, as the python images have) for one stage."""
    subprocess.run([str(base_interpreter), "-m", "venv", str(where)], check=True, timeout=180,
                   capture_output=True)
    return where


def _under(root: Path, value: str) -> str:
    return str(root / value.lstrip("/")) if value.startswith("/") else value


def _copy(run: StageRun, arguments: str, workdir: Path, context: Path | None,
          files: list[str] | None, previous: dict[str, StageRun]) -> None:
    words = arguments.split()
    source_stage = None
    while words and words[0].startswith("--"):
        flag, _, value = words.pop(0).partition("=")
        if flag != "--from":
            raise ValueError(f"COPY flag {flag} is not replayed")
        source_stage = value
    *sources, destination = words
    target = Path(destination) if destination.startswith("/") else workdir / destination
    if source_stage is None:
        if sources != ["."] or context is None or files is None:
            raise ValueError("the replay copies the whole filtered context only: COPY . DEST")
        for relative in files:
            dest = target / relative
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(context / relative, dest, follow_symlinks=False)
        run.log.append(f"COPY {len(files)} context files -> {target}")
        return
    if source_stage not in previous:
        raise ValueError(f"COPY --from={source_stage}: no such stage replayed before")
    for source in sources:
        origin = Path(source)
        if origin != target:
            raise ValueError(f"COPY --from={source_stage} {source} {target}: the replay needs "
                             "the same absolute path on both sides")
        if not origin.is_relative_to(previous[source_stage].root) or not origin.exists():
            raise AssertionError(f"COPY --from={source_stage} {source}: stage left no such path")
        run.copied_from.append((source_stage, origin, target))
        run.log.append(f"COPY --from={source_stage} {origin}")


def _run(run: StageRun, item: Instruction, workdir: Path, env: dict[str, str],
         shims: Path) -> None:
    home = run.root / "root"
    home.mkdir(exist_ok=True)
    full_env = {**BASE_IMAGE_ENV, "HOME": str(home), **env}
    full_env["PATH"] = f"{shims}:{full_env['PATH']}"
    run.log.append(f"RUN (line {item.line}) {item.arguments[:100]}")
    done = subprocess.run(["sh", "-c", item.arguments], cwd=workdir, env=full_env,
                          capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise AssertionError(
            f"Dockerfile line {item.line} failed ({done.returncode}):\n{item.arguments}\n"
            f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
        )


def keep_only(root: Path, keep: list[Path]) -> None:
    """Delete everything under ``root`` except ``keep`` (and the directories leading there)."""
    keep = [k.resolve() for k in keep]
    for entry in root.iterdir():
        resolved = entry.resolve()
        if any(resolved == k for k in keep):
            continue
        if entry.is_dir() and not entry.is_symlink() and any(
            k.is_relative_to(resolved) for k in keep
        ):
            keep_only(entry, keep)
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
