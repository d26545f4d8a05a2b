"""PEP 517 build backend: setuptools, plus descriptor generation from ``protos/``.

Why a wrapper rather than a ``setup.py`` command: editable installs (PEP 660) skip most
setuptools commands, and setuptools already checks that ``api_versions/_generated`` exists
in its metadata hooks. Generation therefore runs first in every hook that builds or
inspects the package, so a fresh clone never depends on generated files being committed.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from setuptools import build_meta as _setuptools

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"
OUT = ROOT / "api_versions" / "_generated"

ConfigSettings = dict[str, str | list[str]] | None


def generate_descriptors() -> list[Path]:
    """Compile every ``protos/<generation>/api.proto`` to a binary FileDescriptorSet.

    One set per generation, loaded at run time into a private descriptor pool: v1alpha1 and
    v1alpha2 both declare ``deviceplugin.*`` with incompatible ``AllocateResponse`` types, so
    they cannot share protobuf's default pool the way ``*_pb2.py`` modules would.
    """
    from grpc_tools import protoc  # build-time dependency only

    OUT.mkdir(parents=True, exist_ok=True)
    init = _scratch(OUT / "__init__.py")
    init.write_text('"""Generated at build time from protos/; never edit."""\n')
    _settle(init, OUT / "__init__.py")
    written = []
    for proto in sorted(PROTOS.glob("*/api.proto")):
        target = OUT / f"{proto.parent.name}.binpb"
        scratch = _scratch(target)
        args = [
            "protoc",
            f"--proto_path={PROTOS}",
            f"--descriptor_set_out={scratch}",
            str(proto.relative_to(PROTOS)),
        ]
        if protoc.main(args) != 0:
            scratch.unlink(missing_ok=True)
            raise RuntimeError(f"protoc failed on {proto}")
        _settle(scratch, target)
        written.append(target)
    if not written:
        raise RuntimeError(f"no protos found under {PROTOS}")
    return written


def _scratch(target: Path) -> Path:
    """A file of this process beside ``target``, to be renamed over it when complete."""
    return target.with_name(f".{target.name}.{os.getpid()}.tmp")


def _settle(scratch: Path, target: Path) -> None:
    """Put ``scratch`` in place of ``target`` in one rename, or drop it if nothing changed.

    Builds run in the source tree (``pip wheel .``, ``pip install -e .``) while the package
    may be in use from that same tree, by a running ``serve`` or a test run: a reader must
    see the old file or the new one, never one that protoc has truncated and not yet
    written, and an unchanged file is not touched at all.
    """
    try:
        unchanged = target.read_bytes() == scratch.read_bytes()
    except FileNotFoundError:
        unchanged = False
    if unchanged:
        scratch.unlink()
    else:
        os.replace(scratch, target)


def get_requires_for_build_wheel(config_settings: ConfigSettings = None) -> list[str]:
    generate_descriptors()
    return _setuptools.get_requires_for_build_wheel(config_settings)


def get_requires_for_build_editable(config_settings: ConfigSettings = None) -> list[str]:
    generate_descriptors()
    return _setuptools.get_requires_for_build_editable(config_settings)


def get_requires_for_build_sdist(config_settings: ConfigSettings = None) -> list[str]:
    return _setuptools.get_requires_for_build_sdist(config_settings)


def prepare_metadata_for_build_wheel(
    metadata_directory: str, config_settings: ConfigSettings = None
) -> str:
    generate_descriptors()
    return _setuptools.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def prepare_metadata_for_build_editable(
    metadata_directory: str, config_settings: ConfigSettings = None
) -> str:
    generate_descriptors()
    return _setuptools.prepare_metadata_for_build_editable(metadata_directory, config_settings)


def build_wheel(
    wheel_directory: str,
    config_settings: ConfigSettings = None,
    metadata_directory: str | None = None,
) -> str:
    generate_descriptors()
    _forget_earlier_builds()
    return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)


def _forget_earlier_builds() -> None:
    """Empty setuptools' ``build/lib`` of this tree before a wheel is built from it.

    setuptools copies the packages into ``build/lib`` and packs whatever is there, but never
    removes what an earlier build left: a module moved out of the shipped packages (the demo,
    the emulators) would still reach every wheel built in a tree that once built it.
    """
    shutil.rmtree(ROOT / "build" / "lib", ignore_errors=True)


def build_editable(
    wheel_directory: str,
    config_settings: ConfigSettings = None,
    metadata_directory: str | None = None,
) -> str:
    generate_descriptors()
    return _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)


def build_sdist(sdist_directory: str, config_settings: ConfigSettings = None) -> str:
    generate_descriptors()
    return _setuptools.build_sdist(sdist_directory, config_settings)


if __name__ == "__main__":
    for path in generate_descriptors():
        print(path.relative_to(ROOT))
