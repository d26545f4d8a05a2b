"""What a release tag must agree with, checked before anything is built or pushed.

The package version in ``pyproject.toml`` is the one version source. A tag ``v<version>``
releases it only when that is the version and CHANGELOG.md has a dated section for it, so a
release never ships a number that the package, the image labels and the changelog do not
all say. The release workflow (``.github/workflows/release.yml``) runs::

    python build_support/release.py check "$GITHUB_REF_NAME" >> "$GITHUB_OUTPUT"
    python build_support/release.py notes 0.3.0 > notes.md

``check`` prints ``version=``, ``minor=`` (the ``X.Y`` image tag) and ``prerelease=`` lines;
a problem goes to stderr with exit 1. Standard library only: it runs before any install.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Releases are X.Y.Z, or X.Y.Z with a PEP 440 pre-release (0.3.0rc1): the form pyproject
# holds, the image tags and the chart version use, and the tag repeats after a "v".
VERSION = re.compile(r"^(?P<major>0|[1-9]\d*)\.(?P<minor>0|[1-9]\d*)\.(?:0|[1-9]\d*)"
                     r"(?P<pre>(?:a|b|rc)(?:0|[1-9]\d*))?$")
HEADING = re.compile(r"^## .*$", re.MULTILINE)
SECTION = re.compile(r"^## \[(?P<name>[^\]]+)\](?: - (?P<date>\d{4}-\d{2}-\d{2}))?\s*$")
LINK_REFERENCE = re.compile(r"^\[[^\]]+\]: \S+\s*$", re.MULTILINE)


class ReleaseError(Exception):
    """A tag, version or changelog that must not be released; the message says why."""


@dataclass(frozen=True)
class Section:
    name: str
    date: str | None
    body: str


def package_version(root: Path = ROOT) -> str:
    with (root / "pyproject.toml").open("rb") as file:
        return str(tomllib.load(file)["project"]["version"])


def sections(changelog: str) -> list[Section]:
    """The ``## [name] - date`` sections of a Keep a Changelog file, in file order; each
    runs to the next ``## `` heading of any kind (the link references at the end of the
    file belong to none)."""
    headings = list(HEADING.finditer(changelog))
    result = []
    for heading, following in zip(headings, [*headings[1:], None], strict=True):
        match = SECTION.match(heading.group())
        if match is None:
            continue
        body = changelog[heading.end():following.start() if following else len(changelog)]
        result.append(Section(match["name"], match["date"],
                              LINK_REFERENCE.sub("", body).strip()))
    return result


def release_section(version: str, root: Path = ROOT) -> Section:
    path = root / "CHANGELOG.md"
    if not path.exists():
        raise ReleaseError(f"{path.name} is missing")
    matching = [s for s in sections(path.read_text()) if s.name == version]
    if not matching:
        raise ReleaseError(f"{path.name} has no section for {version}: rename "
                           f"'## [Unreleased]' to '## [{version}] - YYYY-MM-DD' first")
    (section,) = matching
    if section.date is None:
        raise ReleaseError(f"{path.name}: the section for {version} has no release date "
                           f"('## [{version}] - YYYY-MM-DD')")
    if not section.body:
        raise ReleaseError(f"{path.name}: the section for {version} is empty")
    if "TODO" in section.body:
        raise ReleaseError(f"{path.name}: the section for {version} still has TODO entries")
    return section


def check(tag: str, root: Path = ROOT) -> dict[str, str]:
    """The outputs of a tag that may be released; :class:`ReleaseError` otherwise."""
    version = package_version(root)
    parsed = VERSION.match(version)
    if parsed is None:
        raise ReleaseError(f"pyproject.toml version {version!r} is not X.Y.Z (or X.Y.ZrcN)")
    if tag != f"v{version}":
        raise ReleaseError(f"tag {tag!r} does not name the package version {version!r} "
                           f"(pyproject.toml): tag v{version}, or change the version first")
    release_section(version, root)
    return {"version": version, "minor": f"{parsed['major']}.{parsed['minor']}",
            "prerelease": "true" if parsed["pre"] else "false"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="release.py", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    checking = commands.add_parser("check", help="may this tag be released? print its outputs")
    checking.add_argument("tag")
    notes = commands.add_parser("notes", help="print the CHANGELOG section of a version")
    notes.add_argument("version")
    for command in (checking, notes):
        command.add_argument("--root", type=Path, default=ROOT, help="the source tree")
    args = parser.parse_args(argv)
    try:
        if args.command == "check":
            for key, value in check(args.tag, args.root).items():
                print(f"{key}={value}")
        else:
            print(release_section(args.version, args.root).body)
    except ReleaseError as exc:
        print(f"release.py: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
