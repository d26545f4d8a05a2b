"""PEP 517 build backend: setuptools, plus descriptor generation from ``protos/``.

Why a wrapper rather than a ``setup.py`` command: editable installs (PEP 660) skip most
setuptools commands, and the generated descriptors must exist for normal and editable
installs alike. Generation runs before every wheel, editable or sdist build, so a fresh
clone never depends on generated files being committed.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import build_meta as _setuptools
from setuptools.build_meta import (  # noqa: F401  (re-exported hooks)
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"
OUT = ROOT / "api_versions" / "_generated"


def generate_descriptors() -> list[Path]:
    """Compile every ``protos/<generation>/api.proto`` to a binary FileDescriptorSet.

    One set per generation, loaded at run time into a private descriptor pool: v1alpha1 and
    v1alpha2 both declare ``deviceplugin.*`` with incompatible ``AllocateResponse`` types, so
    they cannot share protobuf's default pool the way ``*_pb2.py`` modules would.
    """
    from grpc_tools import protoc  # build-time dependency only

    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "__init__.py").write_text('"""Generated at build time from protos/; never edit."""\n')
    written = []
    for proto in sorted(PROTOS.glob("*/api.proto")):
        generation = proto.parent.name
        target = OUT / f"{generation}.binpb"
        args = [
            "protoc",
            f"--proto_path={PROTOS}",
            f"--descriptor_set_out={target}",
            str(proto.relative_to(PROTOS)),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {proto}")
        written.append(target)
    if not written:
        raise RuntimeError(f"no protos found under {PROTOS}")
    return written


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):  # type: ignore[no-untyped-def]
    generate_descriptors()
    return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):  # type: ignore[no-untyped-def]
    generate_descriptors()
    return _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)


def build_sdist(sdist_directory, config_settings=None):  # type: ignore[no-untyped-def]
    return _setuptools.build_sdist(sdist_directory, config_settings)


if __name__ == "__main__":
    for path in generate_descriptors():
        print(path.relative_to(ROOT))
